import FoundationEssentials

/// `tokens.redis.sentinel`: the master is found through Redis Sentinel instead of a fixed `url`
/// (docs/redis.md, "Sentinel"). The sentinels are asked in turn for the master's address, and followed
/// through a failover.
public struct RedisSentinelSettings: Sendable, Equatable {
    /// The sentinels, `host:port` (port 26379 by default), asked in this order.
    var addresses: [RedisEndpoint.Address]
    /// The name the sentinels monitor the master under (`sentinel monitor <name> …`).
    public var master: String
    /// The sentinels' own login (an ACL user on the sentinels; the data nodes use `tokens.redis.username`).
    public var username: String?
    public var passwordEnv: String?
    /// TLS to the sentinels (the same keys as every `tls` block); nil: plain TCP.
    public var tls: TLSSettings?

    public static func == (lhs: RedisSentinelSettings, rhs: RedisSentinelSettings) -> Bool {
        lhs.addresses == rhs.addresses && lhs.master == rhs.master && lhs.username == rhs.username && lhs.passwordEnv == rhs.passwordEnv
            && (lhs.tls == nil) == (rhs.tls == nil)
    }

    static let defaultPort = 26379

    /// One line for /status, `check` and the restart notice (never a password).
    var description: String {
        "sentinel master \(master) via \(addresses.map(Self.describe).joined(separator: ","))" + (tls != nil ? " (TLS)" : "")
    }

    static func describe(_ address: RedisEndpoint.Address) -> String {
        switch address {
        case .tcp(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix(let path): "unix://\(path)"
        }
    }

    static func read(from redis: JSONObjectReader) throws -> RedisSentinelSettings? {
        guard let object = try redis.optionalObject("sentinel") else { return nil }
        object.declareKeys(["addresses", "master", "username", "password_env", "tls"])
        guard let texts = try object.optionalStringArray("addresses") else { throw object.missing("addresses") }
        guard !texts.isEmpty else { throw ConfigError(object.fieldPath("addresses"), "must name at least one sentinel (host:port)") }
        guard texts.count <= 64 else { throw ConfigError(object.fieldPath("addresses"), "must name at most 64 sentinels") }
        let addresses = try texts.enumerated().map { index, text in
            try parseAddress(text, field: "\(object.fieldPath("addresses"))[\(index)]")
        }
        let master = try object.string("master")
        if master.isEmpty || master.utf8.count > 256 || master.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) {
            throw ConfigError(object.fieldPath("master"), "must be the name the sentinels monitor, at most 256 bytes without spaces")
        }
        var settings = RedisSentinelSettings(addresses: addresses, master: master)
        settings.username = try object.optionalString("username")
        settings.passwordEnv = try object.optionalString("password_env")
        if settings.username != nil && settings.passwordEnv == nil {
            throw ConfigError(object.fieldPath("username"), "needs password_env")
        }
        settings.tls = try TLSSettings.read(from: object, urlUsesTLS: true, urlKind: "sentinels")
        try object.rejectUnknownKeys()
        return settings
    }

    /// `host:port`, `[v6]:port`, or a bare host (port 26379).
    static func parseAddress(_ text: String, field: String) throws -> RedisEndpoint.Address {
        var host = Substring(text)
        var port = defaultPort
        var portText: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw ConfigError(field, "an IPv6 host needs its closing ]") }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw ConfigError(field, "must be host:port") }
                portText = after.dropFirst()
            }
        } else if let colon = text.lastIndex(of: ":") {
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        if let portText {
            guard let number = Int(portText), (1...65535).contains(number) else { throw ConfigError(field, "port must be a number from 1 to 65535") }
            port = number
        }
        guard !host.isEmpty, !host.contains(where: { $0 == "/" || $0 == "@" || $0.isWhitespace }) else {
            throw ConfigError(field, "must be host:port (no scheme, credentials or path)")
        }
        return .tcp(host: String(host), port: port)
    }
}

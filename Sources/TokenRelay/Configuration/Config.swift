import Glibc

/// The whole configuration, validated. Every field is documented in `config/tokenrelay.schema.json`.
public struct Config: Sendable {
    public var listen: ListenAddress
    /// The default route's upstream; without a top-level `upstream` (`hasDefaultRoute` false), the first
    /// route's, standing in for it where one upstream is named (never sent a request: see `ConfigLoader+Routes`).
    public var upstream: Upstream
    /// Whether the config has a top-level `upstream`. Without one, a request matching no route gets 404.
    public var hasDefaultRoute = true
    /// Whether the config has a top-level identity (`tokens`, `refresh`). Without one every route names an
    /// identity of `identities`, nothing runs for the top level, and `tokens` (no file, no Redis) and `refresh`
    /// (the first identity's) only stand in where a value is needed (`ConfigLoader+DefaultIdentity`).
    public var hasDefaultIdentity = true
    public var tokens: Tokens
    public var refresh: Refresh
    public var admin: Admin?
    /// `tokenrelay login` (device authorization grant); nil when the config has no `login` object.
    public var login: LoginSettings?
    /// Which header carries the access token, and how (`Authorization: Bearer …` unless configured).
    public var inject = InjectSettings()
    /// DPoP proofs for the tokens (`dpop`); nil: bearer tokens only.
    public var dpop: DPoPSettings?
    public var limits = Limits()
    public var timeouts = Timeouts()
    public var forwarding = Forwarding()
    public var logLevel = "info"
    /// `text` (logfmt, for people and grep) or `json` (one object per line, for collectors).
    public var logFormat = LogFormat.text
    public var accessLog = AccessLog()
    /// Which HTTP engine carries the proxied port (`data_plane`).
    public var dataPlane = DataPlane.transport
    /// Further upstreams, each with its identity (`RouteSettings.swift`); empty: the top level is the only route.
    public var routes: [Route] = []
    /// Named identities, sorted by name; the top-level `tokens` and `refresh` are the default one.
    public var identities: [Identity] = []

    public enum DataPlane: String, Sendable {
        /// libevent's evhttp, the engine of earlier releases. Retired: a config that names it still loads
        /// (the key is a public contract) and the transport carries the port, with a warning at start.
        case evhttp
        /// tokenrelay's own HTTP/1.1 transport on libevent's event API (`Sources/HTTPTransport`).
        case transport

        /// The warning a config naming a retired engine gets at start and on reload.
        var retiredWarning: String? {
            self == .evhttp ? "data_plane \"evhttp\" is retired; the proxied port runs on the transport engine (remove the key)" : nil
        }
    }

    /// One log line per client request (`log.access`), the query string only on request.
    public struct AccessLog: Sendable {
        public var enabled = false
        public var includeQuery = false
    }

    public struct Upstream: Sendable {
        public var url: HTTPEndpoint
        /// Request paths forwarded untouched: no token injected, the client's own `Authorization` kept,
        /// and no refresh on their 401 (an API's own login endpoints: refreshing there would loop).
        public var passthroughPrefixes: [String] = []
        /// TLS options for an https:// upstream (nil: the defaults).
        public var tls: TLSSettings? = nil
        /// `upstream.http2`: whether requests go to the upstream over HTTP/2.
        public var http2: HTTP2Mode = .never

        public enum HTTP2Mode: String, Sendable, CaseIterable {
            /// HTTP/1.1 only (the default, and the behaviour before the key existed).
            case never
            /// h2c (or h2 over TLS) with prior knowledge: every connection starts with the HTTP/2 preface.
            case priorKnowledge = "prior_knowledge"
            /// Over TLS, HTTP/2 when the server selects `h2` in ALPN, HTTP/1.1 otherwise.
            case alpn
        }
    }

    public struct Tokens: Sendable {
        /// The token file; with `redis`, optional and only a local cache of the last adopted tokens.
        public var file: String?
        /// Fleet mode: the token set and the refresh lock live in Redis.
        public var redis: RedisSettings?
        /// The token state sealed at rest (`tokens.encryption`); nil: stored as plain JSON.
        public var encryption: TokenEncryptionSettings?
        /// The named identity these tokens are (set by `Config.scoped(to:)`, never read from the file): a sealed
        /// token file is bound to it. Nil: the top-level identity.
        var identity: String?

        init(file: String?) { self.file = file }

        /// The token file for a command that works on the file alone.
        func requireFile(for command: String) throws -> String {
            guard let file else { throw ConfigError("tokens.file", "is required by \(command) (this config keeps tokens in tokens.redis only)") }
            return file
        }
        /// How often the token file is checked for changes made by someone else (an operator, `token import`).
        public var watchIntervalSeconds: Double = 1
    }

    public struct Refresh: Sendable {
        public enum ClientAuth: String, Sendable, CaseIterable {
            case clientSecretBasic = "client_secret_basic"
            case clientSecretPost = "client_secret_post"
            case none
            /// RFC 7523 §2.2: a JWT signed with `client_key_file`, or the ready one in `client_assertion_file`.
            case privateKeyJWT = "private_key_jwt"
            /// RFC 8705 §2.1: the `refresh.tls` client certificate authenticates; the form names the client only.
            case tlsClientAuth = "tls_client_auth"
        }

        public enum SecretSource: Sendable, Equatable {
            case environment(String)
            case file(String)
        }

        /// How new tokens are obtained (`refresh.grant`).
        public enum Grant: String, Sendable, CaseIterable {
            case refreshToken = "refresh_token"
            case clientCredentials = "client_credentials"
            case custom
            /// RFC 7523 §2.1: a signed JWT (`refresh.assertion`) is the grant.
            case jwtBearer = "jwt_bearer"
            /// RFC 8693: a subject token read from a file is exchanged for an access token.
            case tokenExchange = "token_exchange"
        }

        public var grant = Grant.refreshToken
        /// The token endpoint; for the custom grant, `refresh.request.url`.
        public var tokenURL: HTTPEndpoint
        /// Empty only for a custom grant whose request does not use `{{client_id}}`.
        public var clientID: String
        public var clientSecret: SecretSource?
        public var clientAuth: ClientAuth
        public var scope: String?
        /// client_credentials only: `audience` (as Auth0 and others want it) and `resource` (RFC 8707).
        public var audience: String?
        public var resource: String?
        /// The templated request and response mapping of the custom grant.
        public var custom: CustomGrantSettings?
        /// private_key_jwt: where the client assertion comes from (`client_key_file` or `client_assertion_file`).
        public var clientAssertion: ClientAssertionSource?
        /// jwt_bearer: the assertion that is the grant (`refresh.assertion`).
        public var assertion: AssertionGrantSettings?
        /// token_exchange: the tokens exchanged and what is asked for.
        public var tokenExchange: TokenExchangeSettings?
        /// Attempts per refresh cycle for transient failures (connect errors, timeouts, 5xx).
        public var maxAttempts = 4
        /// First retry delay; doubled per attempt.
        public var backoffSeconds = 0.5
        /// Upstream statuses that may mean "access token expired" (401 always does).
        public var triggerStatuses: Set<Int> = [401]
        /// gRPC statuses (`grpc-status`, answered before any response message) that may mean "access token
        /// expired" (16, UNAUTHENTICATED, always does): gRPC answers an expired token with `:status 200`.
        public var triggerGRPCStatuses: Set<Int> = [16]
        /// Refresh before expiry, so that requests almost never wait.
        public var proactive = true
        /// How long before expiry to refresh; nil: 10% of the token's lifetime, within 1 s ... 5 min.
        public var skewSeconds: Double?
        /// Storm guard: at most this many 401-triggered refreshes within `stormWindowSeconds`.
        public var stormMaxRefreshes = 5
        public var stormWindowSeconds = 30.0
        /// TLS options for an https:// token endpoint (nil: the defaults).
        public var tls: TLSSettings? = nil

        /// Whether obtaining a token needs a refresh token. Grants that do not (client_credentials, a
        /// custom request without `{{refresh_token}}`) may start without a token file and fetch one.
        public var needsRefreshToken: Bool {
            switch grant {
            case .refreshToken: true
            case .clientCredentials, .jwtBearer, .tokenExchange: false
            case .custom: custom?.placeholders.contains(.refreshToken) ?? true
            }
        }
    }

    public struct Admin: Sendable {
        public var listen: ListenAddress
        /// `admin.token_file`: a bearer token that `POST /refresh` and `/status` require (read at start).
        public var tokenFile: String? = nil
    }

    public struct Limits: Sendable {
        public var maxBodyBytes = 8 * 1024 * 1024
        public var maxHeaderBytes = 64 * 1024
        public var maxHeldRequests = 1024
        /// Open client connections; see `ClientConnections` for what happens at the limit.
        public var maxClientConnections = 4096
        public var maxUpstreamConnections = 128
        /// Upgraded connections (WebSockets) open at once. A tunnel's upstream connection leaves the pool
        /// at its 101, so tunnels never take `maxUpstreamConnections`; this bounds their descriptors.
        public var maxTunnels = 512
        /// Requests that may wait for a busy pool; beyond it 503.
        public var maxUpstreamWaiters = 4096
        /// Streams one HTTP/2 client connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
        public var maxConcurrentStreams = 100
        /// Pending connections the kernel queues for the proxy listener. The kernel caps it at
        /// net.core.somaxconn, so the default means "the system's maximum".
        public var listenBacklog = 65535
    }

    /// Proxy headers added to forwarded requests (`ForwardingHeaders`).
    public struct Forwarding: Sendable {
        /// Append the client's address to `X-Forwarded-For`.
        public var xForwardedFor = true
        /// Set `X-Forwarded-Proto: http`.
        public var xForwardedProto = true
        /// Append `1.1 tokenrelay` to `Via`.
        public var via = true
        /// Drop client header fields whose name has an underscore (nginx's `underscores_in_headers off`).
        public var dropUnderscoreHeaders = false
    }

    public struct Timeouts: Sendable {
        /// Sending a request and waiting for the response headers (also the outer bound of the connect).
        public var upstreamSeconds = 60.0
        /// Establishing a new upstream connection: resolving, connecting and the TLS handshake.
        public var connectSeconds = 5.0
        /// Silence from the upstream once its response has started (an SSE stream between events).
        public var streamIdleSeconds = 300.0
        /// How long an unused keep-alive upstream connection is kept.
        public var poolIdleSeconds = 30.0
        /// How long a request may wait for a free pooled connection before 503.
        public var poolWaitSeconds = 10.0
        /// One token-endpoint exchange.
        /// Long on purpose: giving up on a refresh the server may still process (a paused or overloaded
        /// token endpoint) loses the rotated refresh token in its answer.
        public var refreshSeconds = 60.0
        /// How long a request may wait for a refresh before it is answered 503.
        public var holdSeconds = 30.0
        /// How long SIGTERM waits for in-flight and held requests.
        public var drainSeconds = 15.0
        /// Idle or stalled client connection.
        public var clientSeconds = 60.0
        /// Receiving a whole request head, however the bytes trickle in (a slowloris client restarts
        /// `clientSeconds` with every byte).
        public var clientHeaderSeconds = 10.0
        /// A streamed upload (a body over `limits.max_body_bytes`, transport engine) goes upstream with
        /// `Expect: 100-continue`, so that a 401 arrives before the body leaves; an upstream that ignores
        /// the expectation and says nothing for this long gets the body anyway.
        public var continueSeconds = 1.0
    }
}

/// `host:port` to listen on; port 0 picks a free port (logged at start).
public struct ListenAddress: Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    static func parse(_ text: String, field: String) throws -> ListenAddress {
        guard let colon = text.lastIndex(of: ":") else {
            throw ConfigError(field, "must be host:port, got \"\(text)\"")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw ConfigError(field, "must name a host, e.g. 127.0.0.1:8080") }
        guard let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
            throw ConfigError(field, "port must be a number from 0 to 65535")
        }
        return ListenAddress(host: host, port: port)
    }

    /// Whether binding both would collide: the same port on the same address, or on a wildcard that
    /// covers the other (`0.0.0.0` every IPv4 address; `::` every address, IPv4 too, as Linux binds it
    /// dual-stack). Port 0 is a fresh port each time. Host names are compared as written: resolving
    /// them here could disagree with what the listener resolves at start.
    func overlaps(_ other: ListenAddress) -> Bool {
        guard port == other.port, port != 0 else { return false }
        let hosts = [Self.canonical(host), Self.canonical(other.host)]
        if hosts[0] == hosts[1] || hosts.contains(.ipv6("::")) { return true }
        if hosts.contains(.ipv4("0.0.0.0")) { return hosts.allSatisfy { if case .ipv4 = $0 { true } else { false } } }
        return false
    }

    private enum CanonicalHost: Equatable {
        case ipv4(String), ipv6(String), name(String)
    }

    /// One spelling per address (`::0001` is `::1`), so equal addresses compare equal.
    private static func canonical(_ host: String) -> CanonicalHost {
        for (family, wrap) in [(AF_INET, CanonicalHost.ipv4), (AF_INET6, CanonicalHost.ipv6)] {
            var address = in6_addr()  // large enough for either family
            var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
            if inet_pton(family, host, &address) == 1, inet_ntop(family, &address, &text, socklen_t(text.count)) != nil {
                return wrap(String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
            }
        }
        return .name(host.lowercased())
    }
}

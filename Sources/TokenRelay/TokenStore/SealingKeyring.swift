import FoundationEssentials
import Glibc
import JOSE

/// One AES-256 key of `tokens.encryption`, with its id: the first 8 bytes of its SHA-256 in hex, stored
/// beside every sealed state so a reader knows which key to try (and can say which one is missing) without
/// trying them all. The id gives nothing of the key away.
struct SealingKey: Sendable {
    let bytes: [UInt8]
    let id: String

    init(bytes: [UInt8]) {
        self.bytes = bytes
        id = Digest.sha256(bytes).prefix(8).map { cFormat("%02x", $0) }.joined()
    }

    static let byteCount = 32

    /// The key from a file's content: exactly 32 bytes taken as they are, otherwise base64 of 32 bytes
    /// (`openssl rand -base64 32`; surrounding whitespace and a final newline allowed). Never quotes the content.
    static func parse(_ content: [UInt8], source: String) throws -> SealingKey {
        if content.count == byteCount { return SealingKey(bytes: content) }
        guard !content.isEmpty else { throw SealingKeyError("\(source) is empty") }
        let text = String(decoding: content, as: UTF8.self).trimmingNewlines().trimmingWhitespace().trimmingNewlines()
        if let decoded = Data(base64Encoded: text), decoded.count == byteCount { return SealingKey(bytes: [UInt8](decoded)) }
        if let decoded = Base64URL.decode(Substring(text)), decoded.count == byteCount { return SealingKey(bytes: decoded) }
        throw SealingKeyError("\(source) holds neither 32 raw bytes nor base64 of 32 bytes (openssl rand -base64 32 makes a key)")
    }
}

struct SealingKeyError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The keys of `tokens.encryption`: the one every write seals with, and the previous ones a read still
/// opens (a state sealed with one of them is rewritten with the current key).
struct SealingKeyring: Sendable {
    let current: SealingKey
    let previous: [SealingKey]
    /// The config field of the current key (`tokens.encryption.key_file`), named when a state does not open.
    var field = "tokens.encryption.key_file"

    /// Reads the keys (blocking file reads: at start, before the loop runs, or on a reload's helper thread).
    /// Each problem is one line naming its field; no key byte is ever in it.
    static func load(_ settings: TokenEncryptionSettings?) throws -> SealingKeyring? {
        guard let settings else { return nil }
        let current: SealingKey
        switch settings.key {
        case .file(let path):
            current = try loadFile(path, field: settings.keyField)
        case .environment(let name):
            guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else {
                throw ConfigError(settings.keyField, "environment variable \(name) is not set or empty")
            }
            do {
                current = try SealingKey.parse(Array(value.utf8), source: "environment variable \(name)")
            } catch {
                throw ConfigError(settings.keyField, "\(error)")
            }
        }
        var previous: [SealingKey] = []
        for (index, path) in settings.previousKeyFiles.enumerated() {
            let key = try loadFile(path, field: "\(settings.path).previous_key_files[\(index)]")
            if key.id != current.id { previous.append(key) }
        }
        return SealingKeyring(current: current, previous: previous, field: settings.keyField)
    }

    static func loadFile(_ path: String, field: String) throws -> SealingKey {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw ConfigError(field, "cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var content: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        // A key is 32 bytes, its base64 45 with a newline: anything much longer is not a key (and a FIFO or
        // /dev/zero must not be read forever).
        while content.count <= 1024 {
            let count = read(fd, &buffer, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw ConfigError(field, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            content.append(contentsOf: buffer[0..<count])
        }
        do {
            return try SealingKey.parse(content, source: path)
        } catch {
            throw ConfigError(field, "\(error)")
        }
    }

    func key(id: String) -> SealingKey? {
        if current.id == id { return current }
        return previous.first { $0.id == id }
    }
}

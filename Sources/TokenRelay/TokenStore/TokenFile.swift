import FoundationEssentials
import Glibc

/// A problem with the token file, naming the file and the cause; never containing a token.
public struct TokenFileError: Error, CustomStringConvertible {
    public let description: String
    /// The cause alone, without the file's name.
    let reason: String
    /// The file holds a sealed state that did not open with the configured keys (see `TokenStateCodec`).
    var sealedStateRefused = false
    /// `kind` names what the file is for (the in-flight refresh marker is written the same way).
    init(_ path: String, _ reason: String, kind: String = "token file") {
        self.reason = reason
        description = "\(kind) \(path): \(reason)"
    }
}

/// Reads and writes the token file (public format: `access_token`, `refresh_token`, optional
/// `expires_at`, anything else preserved).
///
/// Writes are atomic (temporary file in the same directory, fsync, rename, fsync of the directory), so a
/// crash or a full disk leaves either the old file or the new one, never half of one: with refresh-token
/// rotation the old refresh token is already burnt, and a torn file would mean a new login.
struct TokenFile {
    let path: String
    /// Plain JSON, or sealed with `tokens.encryption` (the same document inside).
    var codec: TokenStateCodec = .plain

    /// Identity of the file's current content, to notice changes made by someone else.
    typealias Signature = FileSignature

    func signature() -> Signature? { FileSignature.of(path) }

    /// No file, or an empty one: nothing to load yet (allowed for grants that fetch their first token).
    var isAbsentOrEmpty: Bool {
        var info = stat()
        guard stat(path, &info) == 0 else { return errno == ENOENT }
        return info.st_size == 0
    }

    /// Like ssh with private keys: a token file others can read is refused rather than used.
    func checkPermissions() throws {
        var info = stat()
        guard stat(path, &info) == 0 else { throw TokenFileError(path, String(cString: strerror(errno))) }
        try Self.requireRegularFile(info, path: path)
        let mode = info.st_mode & 0o777
        if mode & 0o077 != 0 {
            throw TokenFileError(path, "is accessible by group or others (mode \(String(mode, radix: 8))); run chmod 600 on it")
        }
    }

    /// A directory, FIFO, socket or device is no token file: say so, instead of a mode complaint or a
    /// read that blocks on a FIFO with no writer.
    static func requireRegularFile(_ info: stat, path: String) throws {
        switch info.st_mode & S_IFMT {
        case S_IFREG: return
        case S_IFDIR: throw TokenFileError(path, "is a directory, not a file")
        default: throw TokenFileError(path, "is not a regular file (a FIFO, socket or device)")
        }
    }

    func load() throws -> TokenSet {
        try loadWithForm().tokens
    }

    /// The tokens, and whether the file holds them plain or sealed (and with which key).
    func loadWithForm() throws -> (tokens: TokenSet, form: StoredTokenForm) {
        var info = stat()
        if stat(path, &info) == 0 { try Self.requireRegularFile(info, path: path) }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw TokenFileError(path, String(cString: strerror(errno)))
        }
        return try codec.decodeWithForm(data, name: path)
    }

    /// The bytes `write` stores: the document, sealed when the codec seals.
    func encode(_ tokens: TokenSet) throws -> Data {
        try codec.encode(tokens)
    }

    static func decode(_ data: Data, path: String) throws -> TokenSet {
        let json: Any
        do {
            json = try StrictJSON.parse(data)
        } catch .malformed {
            // The parser's own message is left out: some of them quote the text around the error, a token.
            throw TokenFileError(path, "is not valid JSON")
        } catch .violation(let violation) {
            throw TokenFileError(path, "is not valid JSON: \(violation)")
        }
        guard var object = json as? [String: Any] else { throw TokenFileError(path, "is not a JSON object") }
        var refresh: String?
        if let value = object.removeValue(forKey: "refresh_token"), !(value is JSONNull) {
            guard let string = value as? String, !string.isEmpty else {
                throw TokenFileError(path, "refresh_token must be a non-empty string")
            }
            // Some grants send it in a header (a custom refresh request), so the same rule as the access token.
            if let reason = TokenSet.unusableReason(string) { throw TokenFileError(path, "refresh_token \(reason)") }
            refresh = string
        }
        // A file seeded with only a refresh token is a valid bootstrap: the access token is fetched at start.
        let accessValue = object.removeValue(forKey: "access_token")
        let access = (accessValue as? String) ?? ""
        if access.isEmpty && (refresh == nil || !(accessValue == nil || accessValue is JSONNull)) {
            throw TokenFileError(path, "access_token is missing or not a non-empty string")
        }
        if !access.isEmpty, let reason = TokenSet.unusableReason(access) { throw TokenFileError(path, "access_token \(reason)") }
        var expiresAt: Date?
        if let value = object.removeValue(forKey: "expires_at"), !(value is JSONNull) {
            guard let text = value as? String, let date = Timestamp.parse(text) else {
                throw TokenFileError(path, "expires_at must be an RFC 3339 time such as 2026-11-21T10:00:00Z")
            }
            expiresAt = date
        }
        return TokenSet(accessToken: access, refreshToken: refresh, expiresAt: expiresAt, otherFields: object)
    }

    /// `expiryMilliseconds`: `expires_at` with milliseconds (the Redis value: every relay of a fleet plans its
    /// refresh from the expiry it reads there, and whole seconds cut up to one from it, so a relay that adopted
    /// a set would plan its refresh up to a second before the relay that got it; `FleetRefreshRateTests`). A
    /// token file keeps whole seconds.
    static func encode(_ tokens: TokenSet, expiryMilliseconds: Bool = false) throws -> Data {
        var object = tokens.otherFields
        object["access_token"] = tokens.accessToken.isEmpty ? nil : tokens.accessToken
        object["refresh_token"] = tokens.refreshToken
        object["expires_at"] = tokens.expiresAt.map(expiryMilliseconds ? RFC3339.formatWithMilliseconds : Timestamp.format)
        return Data(try JSONWriter.data(object, options: [.prettyPrinted, .sortedKeys]))
    }

    /// Atomically replaces the file with `tokens`, mode 0600. Throws without touching the old file on failure.
    func write(_ tokens: TokenSet) throws {
        try Self.write(encode(tokens), to: path)
    }

    /// Atomically replaces the file at `path` with `data` (already encoded), mode 0600; safe on any thread.
    ///
    /// A symlinked token file (a mounted volume, a file managed elsewhere) is written *through*: the
    /// temporary file goes next to the link's final target and is renamed over the target, so the link
    /// stays a link and the target never holds a burnt refresh token while the link's own directory
    /// holds the new one. Replacing the link itself would leave exactly that split.
    static func write(_ data: Data, to configuredPath: String) throws {
        let path = try resolvingSymlinks(configuredPath)
        let directory = FilePath.parent(of: path).isEmpty ? "." : FilePath.parent(of: path)
        let temporary = "\(directory)/.\(FilePath.lastComponent(of: path)).tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw TokenFileError(configuredPath, "cannot create \(temporary): \(String(cString: strerror(errno)))") }
        var failure: String?
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let written = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    failure = "write failed: \(String(cString: strerror(errno)))"
                    return
                }
                offset += written
            }
        }
        if failure == nil, fsync(fd) != 0 { failure = "fsync failed: \(String(cString: strerror(errno)))" }
        close(fd)
        if failure == nil, rename(temporary, path) != 0 { failure = "rename failed: \(String(cString: strerror(errno)))" }
        if let failure {
            unlink(temporary)
            throw TokenFileError(configuredPath, path == configuredPath ? failure : "\(failure) (writing through the symlink to \(path))")
        }
        // The rename is durable only once the directory entry is on disk.
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            fsync(directoryFD)
            close(directoryFD)
        }
    }

    /// The file a write replaces: `path` itself, or the final target of a chain of symlinks (relative
    /// links resolve against the directory of the link that holds them). A dangling link resolves to its
    /// target, which the write then creates.
    static func resolvingSymlinks(_ path: String) throws -> String {
        var current = path
        for _ in 0..<32 {
            var info = stat()
            guard lstat(current, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return current }
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let length = readlink(current, &buffer, buffer.count - 1)
            guard length > 0 else { throw TokenFileError(path, "cannot read the symlink \(current): \(String(cString: strerror(errno)))") }
            let target = String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if target.hasPrefix("/") {
                current = target
            } else {
                let parent = FilePath.parent(of: current)
                current = parent.isEmpty ? target : "\(parent)/\(target)"
            }
        }
        throw TokenFileError(path, "too many levels of symbolic links")
    }
}

import FoundationEssentials
import Glibc
import JOSE

/// Reads a credential someone else keeps current in a file — a client assertion, a jwt_bearer assertion,
/// a subject or actor token — afresh for each token request. Blocking: only ever called on the helper
/// thread that builds the request. Every failure is one line naming the config field and the file, never
/// its content; the caller treats it as transient (the file may be replaced in time for the next attempt).
enum CredentialFile {
    /// More than any JWT an IdP issues; a larger file is the wrong file.
    static let maxBytes = 64 * 1024

    /// The file's text, surrounding spaces and line ends (`echo token > file`) dropped; refused when empty.
    static func text(at path: String, field: String) throws(CredentialUnavailable) -> String {
        let bytes = try read(path, field: field)
        let isSpace = { (byte: UInt8) in byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }
        let start = bytes.firstIndex { !isSpace($0) } ?? bytes.endIndex
        let end = bytes.lastIndex { !isSpace($0) }.map { $0 + 1 } ?? start
        guard let text = String(validating: bytes[start..<max(start, end)], as: UTF8.self) else {
            throw CredentialUnavailable(reason: "\(field): \(path) is not UTF-8 text")
        }
        guard !text.isEmpty else { throw CredentialUnavailable(reason: "\(field): \(path) is empty") }
        return text
    }

    /// The file's JWT, refused when it is not one (a file caught half-written looks like that) or when
    /// its `exp`, read without verifying, has passed: the token endpoint would only refuse it, and a
    /// refusal of the client is much harder to recover from than waiting for the next file.
    static func jwt(at path: String, field: String, now: Date = Date()) throws(CredentialUnavailable) -> String {
        let token = try text(at: path, field: field)
        guard let payload = JWS.unverifiedPayload(Substring(token)),
              let claims = (try? JSONReader.parse(payload)) as? [String: Any] else {
            throw CredentialUnavailable(reason: "\(field): \(path) does not hold a JWT")
        }
        if let exp = claims["exp"] as? JSONNumber, exp.doubleValue <= now.timeIntervalSince1970 {
            throw CredentialUnavailable(reason: "\(field): the JWT in \(path) expired at \(Timestamp.format(Date(timeIntervalSince1970: max(0, exp.doubleValue))))")
        }
        return token
    }

    /// One open and reads to the end: the bytes of one version of the file (a writer that renames a new
    /// file into place, as the kubelet does, never shows us a mix).
    private static func read(_ path: String, field: String) throws(CredentialUnavailable) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw CredentialUnavailable(reason: "\(field): cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 8192)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return bytes }
            if count < 0 {
                if errno == EINTR { continue }
                throw CredentialUnavailable(reason: "\(field): cannot read \(path): \(String(cString: strerror(errno)))")
            }
            bytes.append(contentsOf: chunk[..<count])
            guard bytes.count <= maxBytes else { throw CredentialUnavailable(reason: "\(field): \(path) is larger than \(maxBytes / 1024) KiB") }
        }
    }
}

/// A file the running settings read afresh for every token request.
struct PerRequestCredentialFile {
    let field: String
    let path: String
    /// Must hold an unexpired JWT (else any non-empty text).
    let isJWT: Bool

    static func all(_ settings: Config.Refresh) -> [PerRequestCredentialFile] {
        var files: [PerRequestCredentialFile] = []
        if settings.clientAuth == .privateKeyJWT, case .file(let path)? = settings.clientAssertion {
            files.append(.init(field: "refresh.client_assertion_file", path: path, isJWT: true))
        }
        if settings.grant == .jwtBearer, case .file(let path)? = settings.assertion {
            files.append(.init(field: "refresh.assertion.file", path: path, isJWT: true))
        }
        if settings.grant == .tokenExchange, let exchange = settings.tokenExchange {
            files.append(.init(field: "refresh.subject_token_file", path: exchange.subjectTokenFile,
                               isJWT: exchange.subjectTokenType == TokenExchangeSettings.jwtTokenType))
            if let actor = exchange.actorTokenFile {
                files.append(.init(field: "refresh.actor_token_file", path: actor, isJWT: exchange.actorTokenType == TokenExchangeSettings.jwtTokenType))
            }
        }
        return files
    }

    /// Why the file cannot be used right now, or nil.
    func problem() -> String? {
        do {
            _ = isJWT ? try CredentialFile.jwt(at: path, field: field) : try CredentialFile.text(at: path, field: field)
            return nil
        } catch {
            return "\(error)"
        }
    }
}

extension Preflight {
    /// For `check`: the files read afresh for every token request that could not be used right now, each as
    /// "; WARNING: <reason>". Not errors: whoever writes them (the kubelet) may not have yet, and tokenrelay
    /// starts and retries without them.
    public var credentialFileWarnings: String {
        PerRequestCredentialFile.all(config.refresh).compactMap { file in
            file.problem().map { "; WARNING: \($0) (it is read again for every token request)" }
        }.joined()
    }
}

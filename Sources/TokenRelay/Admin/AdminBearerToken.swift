import FoundationEssentials
import Glibc

/// The bearer token `admin.token_file` holds: with it, `POST /refresh` and `/status` need
/// `Authorization: Bearer <token>` (the probes and the scrape stay open). Read at start and again when
/// the file changes (`Relay.watchAdminToken`); the file is the only place it lives besides memory, and it
/// is added to the log redactor.
struct AdminBearerToken {
    private let token: [UInt8]
    let text: String

    /// One line naming `admin.token_file` when the file cannot be read, is not UTF-8, or is empty.
    static func load(path: String) throws -> AdminBearerToken {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigError("admin.token_file", "cannot read \(path): \(String(cString: strerror(errno)))")
        }
        guard let decoded = String(data: data, encoding: .utf8) else { throw ConfigError("admin.token_file", "\(path) is not UTF-8 text") }
        // A trailing newline is an artefact of `echo token > file`, not part of the token.
        let text = decoded.trimmingNewlines()
        guard !text.isEmpty else { throw ConfigError("admin.token_file", "\(path) is empty") }
        guard !text.contains(where: { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }) else {
            throw ConfigError("admin.token_file", "\(path) holds white space inside the token")
        }
        return AdminBearerToken(token: Array(text.utf8), text: text)
    }

    /// Whether an `Authorization` value carries the token. The comparison takes as long whatever the
    /// candidate's bytes: an attacker timing answers must not learn the token a byte at a time.
    func accepts(_ authorization: String?) -> Bool {
        guard let authorization else { return false }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return false }
        return Self.constantTimeEqual(Array(String(parts[1]).trimmingWhitespace().utf8), token)
    }

    /// Every byte of the longer of the two is looked at, and the lengths are part of the difference.
    static func constantTimeEqual(_ candidate: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = UInt64(candidate.count ^ expected.count)
        let length = max(candidate.count, expected.count)
        for index in 0..<length {
            let a = index < candidate.count ? candidate[index] : 0
            let b = index < expected.count ? expected[index] : 0
            difference |= UInt64(a ^ b)
        }
        return difference == 0
    }
}

import FoundationEssentials
import Glibc
import JOSE

/// `tokenrelay token show`: the state of the token file without revealing a token — fingerprint, expiry,
/// time left, whether a refresh token is present, mode and owner.
public enum TokenFileReport {
    public static func show(configPath: String, identity: String? = nil, now: Date = Date()) throws -> String {
        let config = try ConfigLoader.load(path: configPath).scoped(toIdentityNamed: identity)
        let codecs = try ConfiguredTokenCodecs(config.tokens)
        if let (endpoint, settings) = try RedisTokenCLI.endpoint(config) {
            return try RedisTokenCLI.show(endpoint: endpoint, settings: settings, codec: codecs.redis, now: now)
        }
        let file = TokenFile(path: try config.tokens.requireFile(for: "tokenrelay token show"), codec: codecs.file)
        var info = stat()
        guard stat(file.path, &info) == 0 else { throw TokenFileError(file.path, String(cString: strerror(errno))) }
        let mode = info.st_mode & 0o777
        let owner = getpwuid(info.st_uid).map { String(cString: $0.pointee.pw_name) } ?? "?"
        var lines = ["token file: \(file.path)",
                     "mode: \(cFormat("%04o", mode))\(mode & 0o077 != 0 ? " (too open: tokenrelay refuses it; chmod 600)" : ""), owner: \(owner) (uid \(info.st_uid))"]
        let (tokens, form) = try file.loadWithForm()
        lines.append("stored: \(describe(form, codec: file.codec))")
        lines.append("access token: \(TokenFingerprint.of(tokens.accessToken))")
        lines.append("expires: \(describeExpiry(of: tokens, now: now))")
        lines.append("refresh token: \(tokens.refreshToken.map { "present (\(TokenFingerprint.of($0)))" } ?? "absent")")
        if let dpop = config.dpop { lines.append(describeDPoP(dpop, tokens: tokens)) }
        return lines.joined(separator: "\n")
    }

    /// The DPoP key's thumbprint (RFC 7638 `jkt`, public), never the key, and which key the tokens are bound to.
    static func describeDPoP(_ settings: DPoPSettings, tokens: TokenSet) -> String {
        var key: String
        if let path = settings.keyFile {
            key = (try? SigningKey.load(pemFile: path)).map { "jkt \($0.thumbprint) (dpop.key_file)" } ?? "dpop.key_file cannot be read (tokenrelay check says why)"
        } else if let pem = tokens.otherFields[TokenSet.dpopKeyField] as? String {
            key = (try? SigningKey.load(pem: Array(pem.utf8))).map { "jkt \($0.thumbprint) (kept with the token state)" } ?? "the kept key cannot be read"
        } else {
            key = "none yet (generated at the first start)"
        }
        key += tokens.dpopBoundThumbprint.map { ", tokens bound to jkt \($0)" } ?? ", tokens not DPoP-bound"
        return "dpop: \(settings.alg.rawValue), key \(key)"
    }

    /// Plain or sealed, and with which key (an id, never the key); what `run` will do about it.
    static func describe(_ form: StoredTokenForm, codec: TokenStateCodec) -> String {
        switch form {
        case .plain:
            return codec.sealer == nil ? "plain JSON" : "plain JSON (tokenrelay seals it with tokens.encryption.key_file at its next write)"
        case .sealed(let keyID):
            let previous = codec.needsResealing(form) ? ", a previous key (resealed with tokens.encryption.key_file at the next write)" : ""
            return "sealed, AES-256-GCM, key id \(keyID)\(previous)"
        }
    }

    static func describeExpiry(of tokens: TokenSet, now: Date) -> String {
        guard let expiresAt = TokenExpiry.forStoredTokens(tokens, now: now).expiresAt else {
            return "unknown (no expires_at, not a JWT with exp)"
        }
        let left = expiresAt.timeIntervalSince(now)
        let when = Timestamp.format(expiresAt)
        let clamped = TokenExpiry.clampWarning(for: tokens, now: now).map { " (\($0))" } ?? ""
        return (left > 0 ? "\(when) (in \(duration(left)))" : "\(when) (expired \(duration(-left)) ago)") + clamped
    }

    static func duration(_ seconds: Double) -> String {
        // Expiries are clamped where they are read, but a report must not trap on any input either, nor
        // print a clamped figure as if it were the real one (an `expires_at` in year 1 is not 24855 days old).
        guard seconds < 10 * 365 * 86_400 else { return "over 10 years" }
        let total = Int(max(seconds, 0).rounded(.down))
        let (days, hours, minutes, secs) = (total / 86_400, total % 86_400 / 3600, total % 3600 / 60, total % 60)
        if days > 0 { return "\(days)d \(hours)h" }
        if hours > 0 { return "\(hours)h \(minutes)m" }
        if minutes > 0 { return "\(minutes)m \(secs)s" }
        return "\(secs)s"
    }
}

import FoundationEssentials

/// `tokenrelay token import`: validates tokens given as JSON on standard input (or in a named file) and
/// writes the token file through the same atomic, 0600 writer the proxy uses. Tokens never come from
/// argv, where `ps` and the shell history would show them.
///
/// Input: `{"access_token": …, "refresh_token": …, "expires_at": "<RFC 3339>" | <epoch seconds>}` or
/// `"expires_in": <seconds>` instead of `expires_at`, so a token endpoint's answer can be piped in as is
/// (`token_type` and other keys are kept in the file, as the proxy keeps them).
public enum TokenImport {
    public static func run(configPath: String, identity: String? = nil, input: Data, now: Date = Date()) throws -> String {
        let config = try ConfigLoader.load(path: configPath).scoped(toIdentityNamed: identity)
        let tokens = try parse(input, now: now)
        if config.refresh.needsRefreshToken && tokens.refreshToken == nil {
            throw TokenImportError("refresh_token is required: refresh.grant \(config.refresh.grant.rawValue) cannot renew tokens without one")
        }
        let codecs = try ConfiguredTokenCodecs(config.tokens)
        if let (endpoint, settings) = try RedisTokenCLI.endpoint(config) {
            let version = try RedisTokenCLI.store(tokens, endpoint: endpoint, settings: settings, codec: codecs.redis)
            return "imported: Redis \(endpoint.description) key \(settings.key) version \(version): access token \(TokenFingerprint.of(tokens.accessToken)), "
                + "expires \(TokenFileReport.describeExpiry(of: tokens, now: now)), "
                + "\(tokens.refreshToken == nil ? "no refresh token" : "refresh token present"). Running relays adopt it at once."
        }
        let file = TokenFile(path: try config.tokens.requireFile(for: "tokenrelay token import"), codec: codecs.file)
        try TokenFileLock.withBlockingLock(tokenFilePath: file.path) { try file.write(tokens) }
        let refresh = tokens.refreshToken == nil ? "no refresh token" : "refresh token present"
        return "imported: token file \(file.path) (mode 0600\(codecs.sealer == nil ? "" : ", sealed")): access token \(TokenFingerprint.of(tokens.accessToken)), "
            + "expires \(TokenFileReport.describeExpiry(of: tokens, now: now)), \(refresh). "
            + "A running tokenrelay picks it up within tokens.watch_interval_seconds."
    }

    static func parse(_ input: Data, now: Date) throws -> TokenSet {
        let json: Any
        do {
            json = try StrictJSON.parse(input)
        } catch .malformed {
            throw TokenImportError("input is not valid JSON")
        } catch .violation(let violation) {
            // A second access_token further down must not silently win over the first.
            throw TokenImportError("input is not valid JSON: \(violation)")
        }
        guard let object = json as? [String: Any] else { throw TokenImportError("input is not a JSON object") }
        var rest = object
        let expiresIn = rest.removeValue(forKey: "expires_in")
        let expiresAt = rest.removeValue(forKey: "expires_at")
        // The token file's own decoder checks access and refresh token the way the proxy will at start.
        var tokens = try TokenFile.decode(Data(JSONWriter.data(rest)), path: "input")
        switch (expiresIn, expiresAt) {
        case (nil, nil):
            break
        case (let seconds?, nil):
            guard let seconds = Timestamp.seconds(seconds), seconds >= 0 else {
                throw TokenImportError("expires_in must be a number of seconds")
            }
            tokens.expiresAt = now.addingTimeInterval(TokenExpiry.clampedLifetime(seconds))
        case (nil, let absolute?):
            guard let date = Timestamp.date(absolute) else {
                throw TokenImportError("expires_at must be an RFC 3339 time (2026-11-21T10:00:00Z) or epoch seconds")
            }
            // Kept as given (the relay plans with at most `TokenExpiry.longestLifetime` of it), as long as
            // the file can hold it: RFC 3339 stops at the year 9999.
            guard date.timeIntervalSince1970 <= Timestamp.latestRepresentable else {
                throw TokenImportError("expires_at is after the year 9999")
            }
            tokens.expiresAt = date
        case (_?, _?):
            throw TokenImportError("give either expires_in or expires_at, not both")
        }
        return tokens
    }
}

public struct TokenImportError: Error, CustomStringConvertible {
    public let description: String
    init(_ reason: String) { description = "token import: \(reason)" }
}

import Logging

/// `run` with `tokens.encryption`: a token file found plain (hand-seeded, or from before encryption was
/// configured) or sealed with a previous key is rewritten sealed with `tokens.encryption.key_file` at
/// start, before the event loop runs, so no token stays on disk in clear (or under a retired key) until
/// the next refresh happens to write it.
///
/// Under the token file lock, and from a fresh read: another process (a refreshing relay, `token import`)
/// may have written the file since the preflight read it, and what is rewritten must be what is there
/// now, never the older tokens the preflight saw (the race: a rotation lands between the two reads, and
/// rewriting the older copy would put a burnt refresh token back).
enum StartupResealing {
    /// How long the lock is waited for: a refresh holding it ends within its timeout; past that the file
    /// is left to the next write, which seals it too.
    static func reseal(_ preflight: Preflight, logger: Logger) -> Preflight {
        guard preflight.redis == nil, let file = preflight.tokenFile, let form = preflight.tokenForm,
              file.codec.needsResealing(form) else { return preflight }
        var result: Result<(TokenSet, StoredTokenForm)?, any Error> = .success(nil)
        do {
            try TokenFileLock.withBlockingLock(tokenFilePath: file.path, timeout: preflight.config.timeouts.refreshSeconds + 5) {
                result = Result {
                    guard !file.isAbsentOrEmpty else { return nil }
                    try file.checkPermissions()
                    let (tokens, found) = try file.loadWithForm()
                    if file.codec.needsResealing(found) { try file.write(tokens) }
                    return (tokens, found)
                }
            }
        } catch {
            logger.warning("token file not resealed at start; the next write seals it", metadata: ["error": "\(error)"])
            return preflight
        }
        switch result {
        case .failure(let error):
            logger.warning("token file not resealed at start; the next write seals it", metadata: ["error": "\(error)"])
            return preflight
        case .success(nil):
            return preflight
        case .success(let (tokens, found)?):
            if file.codec.needsResealing(found) {
                let was: String
                switch found {
                case .plain: was = "plain JSON"
                case .sealed(let keyID): was = "sealed with the previous key \(keyID)"
                }
                logger.info("token file sealed with tokens.encryption.key_file", metadata: ["file": "\(file.path)", "was": "\(was)"])
            }
            var resealed = preflight
            resealed.tokens = tokens
            resealed.tokenForm = file.codec.sealer.map { .sealed(keyID: $0.keyring.current.id) }
            return resealed
        }
    }
}

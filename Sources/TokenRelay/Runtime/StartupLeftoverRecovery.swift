import Logging

/// `run`, before the event loop and before resealing: each file identity's temporary token files left by a
/// process killed between its fsync and its rename are settled (`TokenFileLeftovers`): the answer to the
/// refresh that was in flight is put in place, the rest removed. Under the token file lock, so no refreshing
/// process is writing meanwhile; the tokens are then read again, the preflight's copy being older.
enum StartupLeftoverRecovery {
    static func recover(_ preflight: Preflight, logger: Logger) throws -> Preflight {
        let recovered = try recoverStore(preflight, logger: logger)
        for named in preflight.identities {
            var identityLogger = logger
            identityLogger[metadataKey: "identity"] = "\(named.name)"
            named.preflight = try recoverStore(named.preflight, logger: identityLogger)
        }
        return recovered
    }

    private static func recoverStore(_ preflight: Preflight, logger: Logger) throws -> Preflight {
        guard preflight.redis == nil, let file = preflight.tokenFile, TokenFileLeftovers(file: file).anyLeft() else { return preflight }
        var findings: [TokenFileLeftovers.Finding] = []
        do {
            findings = try TokenFileLock.withBlockingLock(tokenFilePath: file.path, timeout: preflight.config.timeouts.refreshSeconds + 5) {
                TokenFileLeftovers(file: file).settle()
            }
        } catch {
            logger.warning("temporary token files not looked at: the token file lock was not free", metadata: ["error": "\(error)"])
            return preflight
        }
        var result = preflight
        for finding in findings {
            log(finding, file: file.path, logger: logger)
            if case .adopted = finding {
                // Read as at start: a state that does not load stops `run` with its one line.
                try file.checkPermissions()
                (result.tokens, result.tokenForm) = try file.loadWithForm()
            }
        }
        return result
    }

    /// One line per temporary file settled (its name and the token file's path; never a token).
    static func log(_ finding: TokenFileLeftovers.Finding, file: String, logger: Logger) {
        switch finding {
        case .adopted(let name):
            logger.notice("recovered the token set a previous run wrote but did not put in place", metadata: ["file": "\(file)", "temporary": "\(name)"])
        case .removed(let name, let reason):
            logger.info("removed a temporary token file a previous run left", metadata: ["file": "\(file)", "temporary": "\(name)", "reason": "\(reason)"])
        case .kept(let name, let reason):
            logger.warning("left a temporary token file a previous run left", metadata: ["file": "\(file)", "temporary": "\(name)", "reason": "\(reason)"])
        }
    }
}

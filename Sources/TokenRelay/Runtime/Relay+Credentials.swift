import Logging

/// The client's credentials changing under a running relay: a key taken up by a reload, an assertion or
/// subject-token file replaced (the kubelet's next projected token). After the token endpoint refused the
/// client, such a change is what can make the next token request succeed, so it is tried at once instead
/// of waiting for `POST /refresh`.
extension Relay {
    /// (Re)starts the watch on the files read for every token request, for the running settings.
    func watchCredentialFiles() {
        guard config.hasDefaultIdentity else { return }
        credentialFilesWatch = CredentialFilesWatch(settings: config.refresh, loop: loop, interval: config.tokens.watchIntervalSeconds) {
            [unowned self] field in self.clientCredentialChanged("\(field) replaced")
        }
    }

    /// What a reload changed of the credentials, if anything: another key (by its RFC 7638 thumbprint),
    /// another certificate, or another place to read an assertion from.
    static func credentialChange(from old: (Config.Refresh, CredentialKeys), to new: (Config.Refresh, CredentialKeys)) -> String? {
        if old.1.identity != new.1.identity { return "a new signing key" }
        if old.0.clientAuth != new.0.clientAuth || old.0.clientAssertion != new.0.clientAssertion || old.0.assertion != new.0.assertion
            || old.0.tokenExchange != new.0.tokenExchange { return "new client authentication settings" }
        return nil
    }

    /// Tries the token endpoint again when the last answer refused it (latched: today "login required",
    /// which a refused client credential also ends in until a latch of its own exists — that latch must be
    /// accepted here too); a relay that is fine has nothing to retry. At most one token request per change:
    /// a credential the endpoint still refuses latches again.
    func clientCredentialChanged(_ cause: String) {
        guard let coordinator else { return }
        Self.retry(coordinator, afterCredentialChange: cause, logger: logger)
    }

    static func retry(_ coordinator: RefreshCoordinator, afterCredentialChange cause: String, logger: Logger) {
        guard coordinator.state == .loginRequired else { return }
        logger.info("client credential changed; asking the token endpoint again", metadata: ["cause": "\(cause)"])
        coordinator.forceRefresh { _ in }
    }
}

import Logging

/// Watches `refresh.client_secret_file` as the token file is watched (a `stat` per interval), so a
/// rotated secret (a Kubernetes Secret update, a vault agent writing a new file) is used from the next
/// refresh on without a signal or a restart.
///
/// A file that changed but cannot be used (unreadable, empty, not UTF-8) is reported once and the
/// secret in use is kept: a half-provisioned file must not turn into refreshes with an empty secret.
/// Confined to the event loop; the read is a few bytes from a local file, like the token file check.
final class ClientSecretWatch {
    private let source: Config.Refresh.SecretSource
    private let path: String
    private let logger: Logger
    private let onChange: (String) -> Void
    private var known: FileSignature?
    private var timer: LoopEvent?

    /// nil unless the secret comes from a file (an environment variable cannot change under a process).
    init?(source: Config.Refresh.SecretSource?, loop: EventLoop, interval: Double, logger: Logger, onChange: @escaping (String) -> Void) {
        guard case .file(let path)? = source else { return nil }
        self.source = .file(path)
        self.path = path
        self.logger = logger
        self.onChange = onChange
        known = FileSignature.of(path)
        let timer = LoopEvent.repeating(loop: loop) { [unowned self] in self.check() }
        timer.schedule(after: interval)
        self.timer = timer
    }

    /// The file as loaded just now by someone else (a reload): not a change to report again.
    func noteLoaded() {
        known = FileSignature.of(path)
    }

    func check() {
        guard let signature = FileSignature.of(path), signature != known else { return }
        known = signature
        do {
            guard let secret = try SecretLoader.load(source) else { return }
            logger.info("client secret file changed; the next refresh uses the new secret", metadata: ["file": "\(path)"])
            onChange(secret)
        } catch {
            logger.error("ignoring changed client secret file; keeping the secret in use", metadata: ["error": "\(error)"])
        }
    }
}

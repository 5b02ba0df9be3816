import Logging

/// Watches `refresh.client_secret_file` (a `FileChangeWatch`), so a rotated secret (a Kubernetes Secret
/// update, a vault agent writing a new file) is used from the next refresh on without a signal or a restart.
///
/// A file that changed but cannot be used (unreadable, empty, not UTF-8) is reported once and the
/// secret in use is kept: a half-provisioned file must not turn into refreshes with an empty secret.
final class ClientSecretWatch {
    private var watch: FileChangeWatch?

    /// nil unless the secret comes from a file (an environment variable cannot change under a process).
    init?(source: Config.Refresh.SecretSource?, loop: EventLoop, interval: Double, logger: Logger, onChange: @escaping (String) -> Void) {
        guard case .file(let path)? = source else { return nil }
        watch = FileChangeWatch(path: path, loop: loop, interval: interval) {
            do {
                guard let secret = try SecretLoader.load(.file(path)) else { return }
                logger.info("client secret file changed; the next refresh uses the new secret", metadata: ["file": "\(path)"])
                onChange(secret)
            } catch {
                logger.error("ignoring changed client secret file; keeping the secret in use", metadata: ["error": "\(error)"])
            }
        }
    }
}

import Logging

/// Watches the files a token request reads afresh (`client_assertion_file`, `assertion.file`,
/// `subject_token_file`, `actor_token_file`) the way the token file is watched: a `stat` per interval.
/// Each request reads them anyway; the watch exists for the time between requests — after the token
/// endpoint refused the client, a replaced file (the kubelet's next projected token) is the credential
/// change worth trying again for, without waiting for a signal.
final class CredentialFilesWatch {
    private var files: [(field: String, path: String, known: FileSignature?)]
    private let onChange: (_ field: String) -> Void
    private var timer: LoopEvent?

    /// nil when the running settings read no such file.
    init?(settings: Config.Refresh, loop: EventLoop, interval: Double, onChange: @escaping (_ field: String) -> Void) {
        let watched = PerRequestCredentialFile.all(settings)
        guard !watched.isEmpty else { return nil }
        files = watched.map { ($0.field, $0.path, FileSignature.of($0.path)) }
        self.onChange = onChange
        let timer = LoopEvent.repeating(loop: loop) { [unowned self] in self.check() }
        timer.schedule(after: interval)
        self.timer = timer
    }

    func check() {
        for index in files.indices {
            let signature = FileSignature.of(files[index].path)
            guard signature != files[index].known else { continue }
            files[index].known = signature
            // A file that disappeared is not a new credential; the next one to appear is.
            if signature != nil { onChange(files[index].field) }
        }
    }
}

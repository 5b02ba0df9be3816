/// One file watched the way the token file is: a `stat` per interval, compared by inode, size and
/// modification time. Reports a file that changed and exists (one that disappeared is not new content;
/// the next one to appear is). Secrets mounted from Kubernetes Secrets and files a vault agent rewrites
/// change this way, by a rename or an atomic symlink swap, so the inode comparison catches them.
/// Confined to the event loop; a `stat` of a local file does not block it in any way that matters.
final class FileChangeWatch {
    let path: String
    private var known: FileSignature?
    private let onChange: () -> Void
    private var timer: LoopEvent?

    init(path: String, loop: EventLoop, interval: Double, onChange: @escaping () -> Void) {
        self.path = path
        self.onChange = onChange
        known = FileSignature.of(path)
        let timer = LoopEvent.repeating(loop: loop) { [unowned self] in self.check() }
        timer.schedule(after: interval)
        self.timer = timer
    }

    func check() {
        guard let signature = FileSignature.of(path), signature != known else { return }
        known = signature
        onChange()
    }
}

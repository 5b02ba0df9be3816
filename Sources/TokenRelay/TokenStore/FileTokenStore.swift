import FoundationEssentials

/// The token file with its advisory lock (`<file>.lock`) and its in-flight refresh marker
/// (`<file>.refreshing`): the store a single host shares among the tokenrelay processes on it, and with
/// `token import` and `login`.
final class FileTokenStore: TokenStore {
    let file: TokenFile
    private let lock: TokenFileLock
    private let loop: EventLoop
    private let marker: RefreshInFlightMarker
    /// The file as last seen (or written) by us: a different `stat` means someone else wrote it.
    private var knownSignature: TokenFile.Signature?

    init(file: TokenFile, lock: TokenFileLock, loop: EventLoop) {
        self.file = file
        self.lock = lock
        self.loop = loop
        marker = RefreshInFlightMarker(tokenFilePath: file.path)
        knownSignature = file.signature()
    }

    var name: String { file.path }
    var kind: String { "file" }
    var isShared: Bool { false }
    var onChange: (() -> Void)?
    var onReachability: ((String?) -> Void)?
    var lockValidUntil: Double? { nil }
    /// flock is held until released: it has no lifetime to change.
    func useLockLifetime(_ seconds: Double) {}

    func start() {}

    /// One `stat`: cheap enough for every watch interval.
    func changeSinceLastLook() -> Bool {
        let signature = file.signature()
        guard signature != knownSignature else { return false }
        knownSignature = signature
        return true
    }

    /// Told what `TokenFileLeftovers` did under the lock (for the log).
    var onLeftovers: ((TokenFileLeftovers.Finding) -> Void)?

    /// The file must be private and well-formed, as at start. Answered at once (a local read).
    func read(completion: @escaping (RefreshMachine.StoreRead) -> Void) {
        settleLeftoversUnderTheLock()
        do {
            try file.checkPermissions()
            completion(.tokens(try file.load()))
        } catch let error as TokenFileError where error.sealedStateRefused {
            completion(.sealedUnopened("\(error)"))
        } catch {
            completion(.unreadable("\(error)"))
        }
    }

    /// Another process sharing the file, killed between the write of its rotation's temporary file and the
    /// rename, left its answer there: taken before this process would present the burnt refresh token. Only
    /// under the lock (no live refresh writes meanwhile) and only with a refresh recorded in flight, so the
    /// usual read costs one more `lstat`.
    private func settleLeftoversUnderTheLock() {
        guard lock.isHeld, case .record = marker.read() else { return }
        TokenFileLeftovers(file: file).settle().forEach { onLeftovers?($0) }
    }

    func noteAdopted() {}

    /// Off the loop (the fsync may be slow); the answer comes back on it.
    func write(_ tokens: TokenSet, completion: @escaping (TokenStoreWrite) -> Void) {
        let data: Data
        do {
            data = try file.encode(tokens)
        } catch {
            return completion(.failed("\(error)"))
        }
        let path = file.path
        OffLoopWork.run(on: loop, { Result { try TokenFile.write(data, to: path) } }) { [weak self] outcome in
            switch outcome {
            case .success:
                self?.knownSignature = self?.file.signature()
                completion(.written)
            case .failure(let error):
                completion(.failed("\(error)"))
            }
        }
    }

    /// One process per file latches by itself; the next tokens written to the file clear it.
    func latchLoginRequired(_ tokens: TokenSet, reason: String) {}

    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void) {
        lock.acquire(timeout: timeout, completion: completion)
    }

    func release() { lock.release() }

    func writeAtExit(_ tokens: TokenSet) throws {
        try file.write(tokens)
    }

    func readInFlightRecord() -> RefreshInFlightRead { marker.read() }

    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void { try marker.writer(for: record) }

    func removeInFlightRecord() throws { try marker.remove() }
}

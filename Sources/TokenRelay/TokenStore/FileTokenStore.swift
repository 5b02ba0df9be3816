import Foundation

/// The token file with its advisory lock (`<file>.lock`) and its in-flight refresh marker
/// (`<file>.refreshing`): the store a single host shares among the tokenrelay processes on it, and with
/// `token import` and `login`.
final class FileTokenStore: TokenStore {
    let file: TokenFile
    private let lock: TokenFileLock
    private let marker: RefreshInFlightMarker
    /// The file as last seen (or written) by us: a different `stat` means someone else wrote it.
    private var knownSignature: TokenFile.Signature?

    init(file: TokenFile, lock: TokenFileLock) {
        self.file = file
        self.lock = lock
        marker = RefreshInFlightMarker(tokenFilePath: file.path)
        knownSignature = file.signature()
    }

    var name: String { file.path }

    /// One `stat`: cheap enough for every watch interval.
    func changeSinceLastLook() -> Bool {
        let signature = file.signature()
        guard signature != knownSignature else { return false }
        knownSignature = signature
        return true
    }

    /// The file must be private and well-formed, as at start.
    func read() throws -> TokenSet {
        try file.checkPermissions()
        return try file.load()
    }

    func writer(for tokens: TokenSet) throws -> @Sendable () throws -> Void {
        let data = try TokenFile.encode(tokens)
        let path = file.path
        return { try TokenFile.write(data, to: path) }
    }

    func noteOwnWrite() { knownSignature = file.signature() }

    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void) {
        lock.acquire(timeout: timeout, completion: completion)
    }

    func release() { lock.release() }

    func readInFlightRecord() -> RefreshInFlightRead { marker.read() }

    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void { try marker.writer(for: record) }

    func removeInFlightRecord() throws { try marker.remove() }
}

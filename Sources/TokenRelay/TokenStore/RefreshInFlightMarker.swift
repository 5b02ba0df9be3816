import FoundationEssentials
import Glibc

/// A refresh that presented a refresh token and whose answer has not been handled yet: which refresh
/// token (its fingerprint, never the token) and when it was sent (wall clock, so that it means something
/// to the next process).
struct RefreshInFlightRecord: Equatable {
    var fingerprint: String
    var sentAt: Date

    init(fingerprint: String, sentAt: Date) {
        self.fingerprint = fingerprint
        self.sentAt = sentAt
    }

    init(refreshToken: String, sentAt: Date) {
        self.init(fingerprint: TokenFingerprint.of(refreshToken), sentAt: sentAt)
    }

    /// The file keeps milliseconds: a record read back is the same record as the one written.
    static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.fingerprint == rhs.fingerprint && abs(lhs.sentAt.timeIntervalSince(rhs.sentAt)) < 0.002
    }
}

/// What the marker file says, as the refresh machine sees it.
enum RefreshInFlightRead: Equatable {
    case none
    case record(RefreshInFlightRecord)
    /// There is a marker, but it cannot be read (hand-edited, or a file that is not ours): last written
    /// at `writtenAt`.
    case unreadable(String, writtenAt: Date)
}

/// `<tokens.file>.refreshing`: the durable half of the refresh hold-off. Written (atomically, fsync'd,
/// mode 0600) before a refresh token leaves, removed once the answer is handled and saved. A process
/// killed mid-refresh leaves it behind, and the next one (or another process sharing the token file)
/// reads it before presenting the same refresh token. Race it prevents: a restart presenting the
/// refresh token while the server is still working on the killed process's presentation of it, which a
/// rotation server answers by revoking the whole session.
///
/// Format: `{"refresh_token_sha256": "sha256:…", "sent_at": "2026-11-21T10:00:00.123Z"}`.
struct RefreshInFlightMarker {
    let path: String

    init(tokenFilePath: String) { path = Self.path(forTokenFile: tokenFilePath) }

    /// Next to the configured token file path, like the lock.
    static func path(forTokenFile tokenFilePath: String) -> String { tokenFilePath + ".refreshing" }

    /// A small file read, like the token file's.
    func read() -> RefreshInFlightRead {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT { return .none }
            // When it was written is unknown too: no hold-off (which would start again at every look),
            // but the refresh token is in doubt.
            return .unreadable("in-flight refresh marker \(path): \(String(cString: strerror(errno)))", writtenAt: .distantPast)
        }
        let writtenAt = Date(timeIntervalSince1970: Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9)
        guard info.st_mode & S_IFMT == S_IFREG else {
            return .unreadable("in-flight refresh marker \(path): is not a regular file", writtenAt: writtenAt)
        }
        guard info.st_size <= 4096, let data = FileManager.default.contents(atPath: path) else {
            return .unreadable("in-flight refresh marker \(path): cannot be read (or is larger than 4 KiB)", writtenAt: writtenAt)
        }
        guard let record = Self.decode(data) else {
            return .unreadable("in-flight refresh marker \(path): expected {\"refresh_token_sha256\": \"sha256:…\", \"sent_at\": an RFC 3339 time}",
                               writtenAt: writtenAt)
        }
        return .record(record)
    }

    static func decode(_ data: Data) -> RefreshInFlightRecord? {
        guard let object = (try? StrictJSON.parse(data)) as? [String: Any],
              let fingerprint = object["refresh_token_sha256"] as? String, fingerprint.hasPrefix("sha256:"), fingerprint.utf8.count <= 80,
              let sentText = object["sent_at"] as? String, let sentAt = Timestamp.parse(sentText) else { return nil }
        return RefreshInFlightRecord(fingerprint: fingerprint, sentAt: sentAt)
    }

    static func encode(_ record: RefreshInFlightRecord) throws -> Data {
        let object = ["refresh_token_sha256": record.fingerprint, "sent_at": RFC3339.formatWithMilliseconds(record.sentAt)]
        return Data(try JSONWriter.data(object, options: [.sortedKeys]))
    }

    /// The write (temporary file, fsync, rename, fsync of the directory), to run off the event loop.
    func writer(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void {
        let data = try Self.encode(record)
        let path = self.path
        return {
            do {
                try TokenFile.write(data, to: path)
            } catch let error as TokenFileError {
                throw TokenFileError(path, error.reason, kind: "in-flight refresh marker")
            }
        }
    }

    /// An unlink, on the event loop: quick, and done before the refresh lock is given back, so it can
    /// never remove the marker of the next process that takes the lock. Not made durable: a marker that
    /// comes back after a crash only holds the next start off for a while, or names a refresh token
    /// that is no longer in the token file and is removed as stale.
    func remove() throws {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw TokenFileError(path, "cannot remove: \(String(cString: strerror(errno)))", kind: "in-flight refresh marker")
        }
    }
}

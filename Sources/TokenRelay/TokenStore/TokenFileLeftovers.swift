import FoundationEssentials
import Glibc

/// The temporary files `TokenFile.write` leaves beside the token file (`.<name>.tmp-<pid>-<n>`) when its
/// process dies between the fsync and the rename. The race it settles: the token endpoint answered a
/// rotation, the new state is complete on disk in the temporary file, and the process was killed before
/// the rename; the token file still holds the refresh token the server has burnt, and the in-flight record
/// names it. Presenting it again would be reuse (a rotation server revokes the session: login required),
/// so the answer that is on disk is put in place instead.
///
/// Adopted only when every condition holds, so that a token file is never replaced by an older or foreign
/// state: the temporary file opens completely as a token state with the file's codec (sealed: the tag
/// verifies with the configured keys and binds it to this file's place), the in-flight record names the
/// refresh token the token file holds now (the temporary file answers exactly the refresh that was in
/// flight), and its refresh token differs from the token file's. Other temporary files of ours whose
/// writer is gone are removed; files not matching our naming are never touched.
///
/// The caller holds the token file lock (no refresh of another process can be writing meanwhile).
struct TokenFileLeftovers {
    let file: TokenFile

    enum Finding: Equatable {
        /// Renamed over the token file; the in-flight record removed.
        case adopted(String)
        case removed(String, reason: String)
        /// Left alone (`reason` says why): more than one could answer the refresh, or a removal failed.
        case kept(String, reason: String)
    }

    /// A temporary file's size bound: a token state is a few KiB at most.
    private static let maximumSize = 1 << 20

    /// Whether there is anything to settle (no lock needed to look): `run` takes the lock only then, so a
    /// start beside a refreshing process does not wait for its lock in the usual case.
    func anyLeft(isAlive: (Int32) -> Bool = Self.isProcessAlive) -> Bool {
        !(leftovers(isAlive: isAlive)?.names.isEmpty ?? true)
    }

    /// Ours (by name), regular files, their writer gone; sorted.
    private func leftovers(isAlive: (Int32) -> Bool) -> (directory: String, target: String, names: [String])? {
        guard let target = try? TokenFile.resolvingSymlinks(file.path) else { return nil }
        let directory = FilePath.parent(of: target).isEmpty ? "." : FilePath.parent(of: target)
        let prefix = ".\(FilePath.lastComponent(of: target)).tmp-"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return nil }
        let ours = names.filter { name in
            guard let pid = Self.writerPID(name, prefix: prefix), pid != getpid(), !isAlive(pid) else { return false }
            var info = stat()
            return lstat("\(directory)/\(name)", &info) == 0 && info.st_mode & S_IFMT == S_IFREG
        }
        return (directory, target, ours.sorted())
    }

    func settle(isAlive: (Int32) -> Bool = Self.isProcessAlive) -> [Finding] {
        guard let (directory, target, leftovers) = leftovers(isAlive: isAlive), !leftovers.isEmpty else { return [] }

        let answering = leftovers.filter { answersTheRefreshInFlight("\(directory)/\($0)") }
        var findings: [Finding] = []
        var adopted: String?
        if answering.count == 1, let name = answering.first {
            if rename("\(directory)/\(name)", target) == 0 {
                Self.syncDirectory(directory)
                try? RefreshInFlightMarker(tokenFilePath: file.path).remove()
                adopted = name
                findings.append(.adopted(name))
            } else {
                findings.append(.kept(name, reason: "cannot be renamed into place: \(String(cString: strerror(errno)))"))
                adopted = name
            }
        }
        for name in leftovers where name != adopted {
            if answering.count > 1 && answering.contains(name) {
                findings.append(.kept(name, reason: "more than one temporary file answers the refresh in flight"))
            } else if unlink("\(directory)/\(name)") == 0 || errno == ENOENT {
                findings.append(.removed(name, reason: "its writer is gone and it is not the answer to the refresh in flight"))
            } else {
                findings.append(.kept(name, reason: "cannot be removed: \(String(cString: strerror(errno)))"))
            }
        }
        return findings
    }

    /// `.<name>.tmp-<pid>-<n>`, decimal digits only (what `TokenFile.write` makes); anything else is not ours.
    static func writerPID(_ name: String, prefix: String) -> Int32? {
        guard name.hasPrefix(prefix) else { return nil }
        let parts = name.dropFirst(prefix.count).split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, parts.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 10 && $0.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } }),
              let pid = Int32(parts[0]), pid > 0, UInt32(parts[1]) != nil else { return nil }
        return pid
    }

    /// Whether `path` is the complete answer to the refresh the in-flight record names.
    private func answersTheRefreshInFlight(_ path: String) -> Bool {
        guard case .record(let record) = RefreshInFlightMarker(tokenFilePath: file.path).read(),
              let current = try? file.load(), let presented = current.refreshToken,
              record.fingerprint == TokenFingerprint.of(presented) else { return false }
        var info = stat()
        // Private like the token file (the start-up check would refuse it otherwise), and small.
        guard lstat(path, &info) == 0, info.st_mode & 0o077 == 0, info.st_size <= Self.maximumSize,
              let data = FileManager.default.contents(atPath: path),
              let answer = try? file.codec.decode(data, name: path),
              let rotated = answer.refreshToken else { return false }
        return rotated != presented
    }

    /// A PID that exists (EPERM: it exists, another user's) may be a writer still at work.
    static func isProcessAlive(_ pid: Int32) -> Bool {
        kill(pid, 0) == 0 || errno == EPERM
    }

    /// The rename is durable only once the directory entry is on disk (as in `TokenFile.write`).
    private static func syncDirectory(_ directory: String) {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }
}

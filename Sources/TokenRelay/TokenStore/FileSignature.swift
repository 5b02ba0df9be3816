import Glibc

/// What a `stat` says about a file, enough to notice that someone replaced or rewrote it: an atomic
/// rename (a new inode), a Kubernetes Secret update (the mounted symlink switches to a new file), an
/// edit in place (time or size), a `chmod` (the status-change time: a file refused for its mode must
/// be looked at again once the operator fixes the mode). Cheap enough to take once per watch interval.
struct FileSignature: Equatable {
    let inode: UInt64
    let modified: Int
    let modifiedNanos: Int
    let changed: Int
    let changedNanos: Int
    let size: Int

    /// Follows symlinks; nil when the file cannot be stat'ed.
    static func of(_ path: String) -> FileSignature? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return FileSignature(inode: UInt64(info.st_ino), modified: info.st_mtim.tv_sec, modifiedNanos: info.st_mtim.tv_nsec,
                             changed: info.st_ctim.tv_sec, changedNanos: info.st_ctim.tv_nsec, size: Int(info.st_size))
    }
}

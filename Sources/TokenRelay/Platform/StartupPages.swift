import Glibc

/// Hands back the code pages that only starting up touched.
///
/// Starting reads the config, parses arguments, builds TLS contexts and, at its first dynamic casts, has
/// the Swift runtime scan every protocol conformance record in the binary, which touches pages all over
/// its code and read-only data. None of that runs again, but the pages stay mapped and count towards the
/// process's resident memory for its whole life (about two thirds of an idle relay's RSS). They are clean
/// copies of the executable and its libraries, so `madvise(MADV_DONTNEED)` may unmap them: the page cache
/// keeps them, and the code that does run again is mapped back on its next use, from memory, not disk.
///
/// Only mappings that are executable and not writable are released: such pages can never have been
/// modified, so nothing is lost. Writable or relocated data (`rw-p`, and the `r--p` segment the loader
/// wrote relocations into) is left alone: dropping a private page that was written would lose the write.
enum StartupPages {
    /// Bytes of mappings released (for the log line).
    @discardableResult
    static func release() -> Int {
        guard let maps = fopen("/proc/self/maps", "r") else { return 0 }
        defer { fclose(maps) }
        var released = 0
        var line: UnsafeMutablePointer<CChar>? = nil
        var capacity = 0
        defer { free(line) }
        // Bounded: /proc/self/maps has one line per mapping.
        for _ in 0..<100_000 {
            guard getline(&line, &capacity, maps) > 0, let line else { break }
            guard let range = executableReadOnlyRange(String(cString: line)) else { continue }
            let length = Int(range.end - range.start)
            if madvise(UnsafeMutableRawPointer(bitPattern: range.start), length, MADV_DONTNEED) == 0 {
                released += length
            }
        }
        return released
    }

    /// `start-end r-xp offset dev inode path` for a file-backed mapping: its address range. Not the vDSO
    /// or vsyscall pages (no file behind them).
    static func executableReadOnlyRange(_ line: String) -> (start: UInt, end: UInt)? {
        let parts = line.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count >= 6, parts[1] == "r-xp", parts[5].hasPrefix("/") else { return nil }
        let bounds = parts[0].split(separator: "-")
        guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16), end > start else {
            return nil
        }
        return (start, end)
    }
}

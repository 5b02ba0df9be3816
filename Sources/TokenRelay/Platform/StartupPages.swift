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
/// Only mappings that are executable and not writable, and hold no private copy of a page, are released:
/// their pages are the file's, so nothing is lost. Writable or relocated data (`rw-p`, and the `r--p`
/// segment the loader wrote relocations into) is left alone, and so is code the loader patched (text
/// relocations make private copies, `Anonymous` in smaps): dropping a page that was written would lose
/// the write.
enum StartupPages {
    /// Bytes of mappings released (for the log line).
    @discardableResult
    static func release() -> Int {
        guard let maps = fopen("/proc/self/smaps", "r") else { return 0 }
        defer { fclose(maps) }
        var released = 0
        var line: UnsafeMutablePointer<CChar>? = nil
        var capacity = 0
        defer { free(line) }
        // A mapping's header line, then its fields; the candidate is decided at its `Anonymous:` line.
        var candidate: (start: UInt, end: UInt)?
        // Bounded: /proc/self/smaps has a couple of dozen lines per mapping.
        for _ in 0..<1_000_000 {
            guard getline(&line, &capacity, maps) > 0, let line else { break }
            let text = String(cString: line)
            if text.hasPrefix("Anonymous:") {
                let copied = text.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Int($0) } ?? 1
                if let range = candidate, copied == 0 {
                    let length = Int(range.end - range.start)
                    if madvise(UnsafeMutableRawPointer(bitPattern: range.start), length, MADV_DONTNEED) == 0 { released += length }
                }
                candidate = nil
            } else if text.split(separator: " ", maxSplits: 1).first?.contains("-") == true {
                candidate = executableReadOnlyRange(text)
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

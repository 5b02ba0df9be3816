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
/// Only private file mappings that are not writable (`r-xp` code, `r--p` read-only data) and hold no
/// private copy of a page are released: their pages are the file's, so nothing is lost. Read-only data
/// counts as much as code: the shared libraries' symbol tables, hash tables and relocation records, which
/// the loader reads once while binding at start (libcrypto's and libstdc++'s alone are about 1.4 MiB,
/// issue 26), are `r--p` mappings never needed again. Writable data (`rw-p`) is left alone, and so is any
/// mapping holding a page that was written (the `r--p` segment the loader wrote relocations into, code
/// patched by text relocations: private copies, `Anonymous` in smaps): dropping it would lose the write.
///
/// The list is read whole first and released at the end, with C-string scanning rather than `String`:
/// whatever code runs after a release is mapped back, and the kernel maps 64 KiB around every page that
/// faults (fault-around), so parsing with `String` between releases brought back about 1.5 MiB of the
/// standard library's string code that nothing needs afterwards (issue 26).
enum StartupPages {
    /// Bytes of mappings released (for the log line).
    @discardableResult
    static func release() -> Int {
        guard let maps = fopen("/proc/self/smaps", "r") else { return 0 }
        var ranges: [(start: UInt, end: UInt)] = []
        ranges.reserveCapacity(64)
        var line: UnsafeMutablePointer<CChar>? = nil
        var capacity = 0
        // A mapping's header line, then its fields; the candidate is decided at its `Anonymous:` line.
        var candidate: (start: UInt, end: UInt)?
        // Bounded: /proc/self/smaps has a couple of dozen lines per mapping.
        for _ in 0..<1_000_000 {
            guard getline(&line, &capacity, maps) > 0, let line else { break }
            if strncmp(line, "Anonymous:", 10) == 0 {
                if let range = candidate, strtol(line + 10, nil, 10) == 0 { ranges.append(range) }
                candidate = nil
            } else if let range = mappingRange(line) {
                candidate = range.readOnlyFile ? (range.start, range.end) : nil
            }
        }
        free(line)
        fclose(maps)
        var released = 0
        for range in ranges {
            let length = Int(range.end - range.start)
            if madvise(UnsafeMutableRawPointer(bitPattern: range.start), length, MADV_DONTNEED) == 0 { released += length }
        }
        return released
    }

    /// `start-end r-xp|r--p offset dev inode path` for a file-backed mapping: its address range. Not the
    /// vDSO or vsyscall pages (no file behind them), nothing writable or shared.
    static func readOnlyFileRange(_ line: UnsafePointer<CChar>) -> (start: UInt, end: UInt)? {
        guard let range = mappingRange(line), range.readOnlyFile else { return nil }
        return (range.start, range.end)
    }

    /// A smaps header line's range, and whether it is `r-xp` or `r--p` with a path; nil for any other line (field
    /// lines such as `AnonHugePages:` start with a hex digit too, but no `-` follows it).
    private static func mappingRange(_ line: UnsafePointer<CChar>) -> (start: UInt, end: UInt, readOnlyFile: Bool)? {
        var cursor: UnsafeMutablePointer<CChar>? = nil
        let start = UInt(strtoul(line, &cursor, 16))
        guard var p = cursor.map({ UnsafePointer($0) }), p != line, p.pointee == 0x2D /* - */ else { return nil }
        let end = UInt(strtoul(p + 1, &cursor, 16))
        guard let afterEnd = cursor.map({ UnsafePointer($0) }), afterEnd != p + 1, afterEnd.pointee == 0x20, end > start else { return nil }
        p = afterEnd
        func skipSpaces() { while p.pointee == 0x20 || p.pointee == 0x09 { p += 1 } }
        func skipWord() { while p.pointee != 0 && p.pointee != 0x20 && p.pointee != 0x09 && p.pointee != 0x0A { p += 1 } }
        skipSpaces()
        let readOnlyPrivate = strncmp(p, "r-xp ", 5) == 0 || strncmp(p, "r--p ", 5) == 0
        for _ in 0..<4 { skipWord(); skipSpaces() }   // permissions, offset, device, inode
        return (start, end, readOnlyPrivate && p.pointee == 0x2F /* / */)
    }
}

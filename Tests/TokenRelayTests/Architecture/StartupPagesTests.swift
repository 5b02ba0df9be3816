@testable import TokenRelay
import XCTest

/// Which mappings `StartupPages.release` may hand back: code or read-only data, never writable or shared,
/// backed by a file (a mapping with a written page is excluded later, by its `Anonymous:` line).
final class StartupPagesTests: XCTestCase {
    func testOnlyFileBackedReadOnlyPrivateMappingsAreReleased() {
        let text = StartupPages.readOnlyFileRange("55e3d50a6000-55e3d5e74000 r-xp 00a25000 fd:01 1234  /usr/bin/tokenrelay\n")
        XCTAssertNotNil(StartupPages.readOnlyFileRange("7f12c0000000-7f12c0021000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6"))
        XCTAssertEqual(text?.start, 0x55e3d50a6000)
        XCTAssertEqual(text?.end, 0x55e3d5e74000)
        let data = StartupPages.readOnlyFileRange("7f5a6ac00000-7f5a6acc5000 r--p 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libcrypto.so.3")
        XCTAssertEqual(data?.start, 0x7f5a6ac00000)   // symbol and relocation tables, read once by the loader
        for line in [
            "7f5a6b000000-7f5a6b001000 r--s 00000000 08:01 88 /dev/shm/shared",           // shared: writes by others
            "55e3d5ecf000-55e3d60d9000 rw-p 014a4000 fd:01 1234  /usr/bin/tokenrelay",   // writable data
            "7ffd1c9e5000-7ffd1c9e7000 r-xp 00000000 00:00 0  [vdso]",                    // no file behind it
            "7f0000000000-7f0000021000 rwxp 00000000 00:00 0 ",                           // anonymous, writable
            "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]",
            "garbage",
            "AnonHugePages:         0 kB",                                                // a field line
            "Anonymous:             0 kB",
            "55e3d50a6000-55e3d5e74000",
            "",
        ] {
            XCTAssertNil(StartupPages.readOnlyFileRange(line), line)
        }
    }

    /// Releasing runs in this very process and everything keeps working afterwards: the released code,
    /// this test's included, is mapped back from the page cache when it runs again.
    func testReleasingKeepsTheProcessRunning() {
        XCTAssertGreaterThan(StartupPages.release(), 0)
        XCTAssertEqual([3, 1, 2].sorted(), [1, 2, 3])
    }
}

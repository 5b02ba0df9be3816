@testable import TokenRelay
import XCTest

/// Which mappings `StartupPages.release` may hand back: executable, never writable, backed by a file.
final class StartupPagesTests: XCTestCase {
    func testOnlyFileBackedExecutableReadOnlyMappingsAreReleased() {
        let text = StartupPages.executableReadOnlyRange("55e3d50a6000-55e3d5e74000 r-xp 00a25000 fd:01 1234  /usr/bin/tokenrelay\n")
        XCTAssertNotNil(StartupPages.executableReadOnlyRange("7f12c0000000-7f12c0021000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6"))
        XCTAssertEqual(text?.start, 0x55e3d50a6000)
        XCTAssertEqual(text?.end, 0x55e3d5e74000)
        for line in [
            "55e3d5e75000-55e3d5ecf000 r--p 0144a000 fd:01 1234  /usr/bin/tokenrelay",   // relocated data
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
            XCTAssertNil(StartupPages.executableReadOnlyRange(line), line)
        }
    }

    /// Releasing runs in this very process and everything keeps working afterwards: the released code,
    /// this test's included, is mapped back from the page cache when it runs again.
    func testReleasingKeepsTheProcessRunning() {
        XCTAssertGreaterThan(StartupPages.release(), 0)
        XCTAssertEqual([3, 1, 2].sorted(), [1, 2, 3])
    }
}

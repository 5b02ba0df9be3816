import Foundation
import XCTest

/// Real-time tests of rules that `RefreshMachineTests` cover in milliseconds with a manual clock (and
/// that keep one end-to-end test each in the default run) run only with TOKENRELAY_SLOW_TESTS=1.
func skipUnlessSlowTestsEnabled(_ coveredBy: String) throws {
    guard ProcessInfo.processInfo.environment["TOKENRELAY_SLOW_TESTS"] == "1" else {
        throw XCTSkip("real-time soak of a rule covered by \(coveredBy); set TOKENRELAY_SLOW_TESTS=1")
    }
}

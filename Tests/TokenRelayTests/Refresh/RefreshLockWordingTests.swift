import Foundation
import XCTest
@testable import TokenRelay

/// A lock wait that runs out names the lock it waited for. Found by the black-box probe: in fleet mode the
/// log said "timed out waiting for the token file lock", sending the operator to a file that is not used.
final class RefreshLockWordingTests: XCTestCase {
    private func reasonAfterLockTimeout(sharedStore: Bool) -> String? {
        let now = RefreshMachine.Instant(monotonic: 1000, wall: Date(timeIntervalSince1970: 1_800_000_000), jitter: 0.5)
        var settings = RefreshMachine.Settings()
        settings.sharedStore = sharedStore
        var machine = RefreshMachine(tokens: TokenSet(accessToken: "a1", refreshToken: "r1", expiresAt: now.wall.addingTimeInterval(3600)),
                                     settings: settings, now: now)
        _ = machine.start(now: now, inFlight: nil)
        _ = machine.unauthorized(sentGeneration: 1, now: now)
        _ = machine.timerFired(.attempt, now: now)
        let actions = machine.lockTimedOut(now: now)
        for case .log(_, _, let metadata) in actions { if let reason = metadata["reason"] { return reason } }
        return nil
    }

    func testTheFileLockIsNamedForATokenFile() {
        XCTAssertEqual(reasonAfterLockTimeout(sharedStore: false), "timed out waiting for the token file lock")
    }

    func testTheSharedLockIsNamedInFleetMode() {
        XCTAssertEqual(reasonAfterLockTimeout(sharedStore: true),
                       "timed out waiting for the fleet's refresh lock (held by another relay, or the token store did not answer)")
    }
}

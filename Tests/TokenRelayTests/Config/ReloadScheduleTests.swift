import XCTest
@testable import TokenRelay

/// The rules of `ReloadSchedule`, in process: one preparation at a time, a SIGHUP during one makes it
/// run again with its result discarded, nothing applies after shutdown began, systemd hears one READY=1.
final class ReloadScheduleTests: XCTestCase {
    func testOneReloadIsAnnouncedPreparedAppliedAndEnded() {
        var schedule = ReloadSchedule()
        XCTAssertEqual(schedule.signalled(), [.notifyReloading, .prepare])
        XCTAssertTrue(schedule.isPreparing)
        XCTAssertEqual(schedule.prepared(), [.applyPrepared, .notifyReady])
        XCTAssertFalse(schedule.isPreparing)
        XCTAssertEqual(schedule.signalled(), [.notifyReloading, .prepare], "the next SIGHUP starts a new reload")
    }

    /// Two (or more) quick SIGHUPs: never two preparations at once, the first result is dropped, the
    /// config is read once more, and only that result is applied.
    func testSIGHUPsDuringAPreparationCoalesceIntoOneMoreRun() {
        var schedule = ReloadSchedule()
        XCTAssertEqual(schedule.signalled(), [.notifyReloading, .prepare])
        XCTAssertEqual(schedule.signalled(), [.noteRequestedAgain])
        XCTAssertEqual(schedule.signalled(), [.noteRequestedAgain], "a third SIGHUP adds no further run")
        XCTAssertEqual(schedule.prepared(), [.discardSuperseded, .notifyReloading, .prepare])
        XCTAssertTrue(schedule.isPreparing)
        XCTAssertEqual(schedule.prepared(), [.applyPrepared, .notifyReady], "the newest read is applied")
        XCTAssertEqual(schedule, ReloadSchedule(), "back at rest")
    }

    func testNothingAppliesOnceShutdownBegan() {
        var schedule = ReloadSchedule()
        XCTAssertEqual(schedule.signalled(), [.notifyReloading, .prepare])
        XCTAssertEqual(schedule.signalled(), [.noteRequestedAgain])
        schedule.shutdownBegan()
        XCTAssertEqual(schedule.prepared(), [.discardShuttingDown], "no apply, no READY=1 after STOPPING=1, no further run")
        XCTAssertFalse(schedule.isPreparing)
        XCTAssertEqual(schedule.signalled(), [.ignoreShuttingDown])
    }

    func testSIGHUPAfterShutdownIsIgnored() {
        var schedule = ReloadSchedule()
        schedule.shutdownBegan()
        XCTAssertEqual(schedule.signalled(), [.ignoreShuttingDown])
        XCTAssertFalse(schedule.isPreparing)
    }
}

import XCTest
@testable import TokenRelay

/// Which `grpc-status` values say "the token is no longer accepted".
final class GRPCRefreshTriggerTests: XCTestCase {
    func testAConfiguredStatusTriggersAndOthersDoNot() {
        XCTAssertTrue(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: "16", triggerStatuses: [16]))
        XCTAssertFalse(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: "0", triggerStatuses: [16]))
        XCTAssertFalse(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: "7", triggerStatuses: [16]))
        XCTAssertTrue(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: "7", triggerStatuses: [7, 16]))
        XCTAssertFalse(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: nil, triggerStatuses: [16]), "no status field: not a refusal")
    }

    /// The value is the upstream's: anything but one to three digits is no status, and nothing traps.
    func testAMalformedStatusIsNoStatus() {
        for value in ["", " 16", "16 ", "+16", "-16", "1 6", "0x10", "16.0", "１６", "99999999999999999999999", "1616"] {
            XCTAssertNil(GRPCRefreshTrigger.statusCode(value), value)
            XCTAssertFalse(GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: value, triggerStatuses: [16]), value)
        }
        XCTAssertEqual(GRPCRefreshTrigger.statusCode("016"), 16)
        XCTAssertEqual(GRPCRefreshTrigger.statusCode("999"), 999)
    }
}

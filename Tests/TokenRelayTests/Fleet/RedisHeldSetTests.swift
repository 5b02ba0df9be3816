import Foundation
import XCTest
@testable import TokenRelay

/// What a stored version lower than the one a relay holds means: a lost write (put back) or an operator's
/// newer import (adopted).
final class RedisHeldSetTests: XCTestCase {
    private func held(version: Int64 = 5, stamp: Int64? = 1_000, latched: Bool = false) -> RedisHeldSet {
        RedisHeldSet(version: version, value: Data("{}".utf8), loginRequired: latched ? "refused" : "", importStamp: stamp)
    }

    func testALowerVersionOfTheSameLineageIsPutBack() {
        XCTAssertEqual(held().verdict(storedVersion: 3, storedImportStamp: 1_000), .putBack)
        XCTAssertEqual(held().verdict(storedVersion: 3, storedImportStamp: 999), .putBack, "an older import is our lineage's past")
        XCTAssertEqual(held().verdict(storedVersion: 3, storedImportStamp: nil), .putBack)
        XCTAssertEqual(held(stamp: nil).verdict(storedVersion: 3, storedImportStamp: nil), .putBack)
    }

    func testANewerImportIsAdopted() {
        XCTAssertEqual(held().verdict(storedVersion: 1, storedImportStamp: 1_001), .newerImport)
        XCTAssertEqual(held(stamp: nil).verdict(storedVersion: 1, storedImportStamp: 1), .newerImport)
        XCTAssertEqual(held(latched: true).verdict(storedVersion: 1, storedImportStamp: 1_001), .newerImport)
    }

    func testTheSameOrAHigherVersionAndALatchedSetAreLeftAlone() {
        XCTAssertEqual(held().verdict(storedVersion: 5, storedImportStamp: 1_000), .current)
        XCTAssertEqual(held().verdict(storedVersion: 9, storedImportStamp: 2_000), .current)
        XCTAssertEqual(held(latched: true).verdict(storedVersion: 3, storedImportStamp: 1_000), .current)
    }

    func testAnImportStampIsNowAndPastTheStoredOne() {
        let now = Date(timeIntervalSince1970: 1_800_000_000.5)
        XCTAssertEqual(RedisHeldSet.importStamp(now: now, stored: nil), 1_800_000_000_500)
        XCTAssertEqual(RedisHeldSet.importStamp(now: now, stored: 1_900_000_000_000), 1_900_000_000_001, "a clock behind the last importer's")
    }

    /// The local cache's mark survives the token file's encoding, and is taken off before the tokens are used.
    func testTheCachesMarkRoundTripsAndIsTakenOff() throws {
        let tokens = TokenSet(accessToken: "a2", refreshToken: "r2", expiresAt: Date(timeIntervalSince1970: 1_800_000_000), otherFields: ["note": "kept"])
        let marked = UnacknowledgedWriteMark.marking(tokens, .init(overVersion: 7, importStamp: 1_800_000_000_123))
        let read = try TokenFile.decode(TokenFile.encode(marked), path: "cache")
        let (plain, mark) = UnacknowledgedWriteMark.take(from: read)
        XCTAssertEqual(mark, .init(overVersion: 7, importStamp: 1_800_000_000_123))
        XCTAssertNil(plain.otherFields[UnacknowledgedWriteMark.field])
        XCTAssertEqual(plain.otherFields["note"] as? String, "kept")
        XCTAssertFalse(String(decoding: try TokenFile.encode(plain), as: UTF8.self).contains(UnacknowledgedWriteMark.field))
        XCTAssertNil(UnacknowledgedWriteMark.take(from: tokens).mark)
        var unusable = tokens
        unusable.otherFields[UnacknowledgedWriteMark.field] = "seven"
        XCTAssertNil(UnacknowledgedWriteMark.take(from: unusable).mark)
        XCTAssertNil(UnacknowledgedWriteMark.take(from: unusable).tokens.otherFields[UnacknowledgedWriteMark.field])
    }
}

/// Versions and stamps come from outside (a Redis record, the local cache file): the largest one must not
/// trap when the next one is made from it.
final class RedisVersionArithmeticTests: XCTestCase {
    func testAnImportOverTheLargestStoredStampDoesNotTrap() {
        XCTAssertEqual(RedisHeldSet.importStamp(now: Date(timeIntervalSince1970: 1_800_000_000), stored: Int64.max), Int64.max)
    }

    func testACacheMarkWithTheLargestVersionDoesNotTrap() throws {
        let tokens = TokenSet(accessToken: "a2", refreshToken: "r2")
        var cached = tokens
        cached.otherFields[UnacknowledgedWriteMark.field] = ["over_version": JSONNumber(1e19)] as [String: Any]
        let (plain, mark) = UnacknowledgedWriteMark.take(from: cached)
        let taken = try XCTUnwrap(mark)
        let loop = try EventLoop()
        let store = RedisTokenStore(loop: loop, settings: RedisSettings(endpoint: RedisEndpoint(address: .unix(path: "/nonexistent")), key: "k"),
                                    endpoint: RedisEndpoint(address: .unix(path: "/nonexistent")), refreshSeconds: 5)
        XCTAssertNoThrow(try store.holdUnacknowledged(plain, taken))
    }
}

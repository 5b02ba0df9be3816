import Foundation
import XCTest
@testable import TokenRelay

/// Temporary token files left by a process killed between the fsync and the rename, in-process with a
/// temporary directory: only the answer to exactly the refresh in flight is put in place; the rest of ours
/// is removed, and nothing else is touched.
final class TokenFileLeftoversTests: XCTestCase {
    private var directory: URL!
    private var tokenPath: String { directory.appendingPathComponent("tokens.json").path }
    private let burnt = TokenSet(accessToken: "old-access-AAAA", refreshToken: "burnt-refresh-BBBB")
    private let rotated = TokenSet(accessToken: "new-access-CCCC", refreshToken: "rotated-refresh-DDDD")
    /// A PID no process has (above any pid_max); the writer of every leftover below is gone.
    private let deadPID: Int32 = 2_000_000_000
    private let noneAlive: (Int32) -> Bool = { _ in false }

    override func setUpWithError() throws { directory = makeTemporaryDirectory() }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: directory) }

    private func file(_ codec: TokenStateCodec = .plain) -> TokenFile { TokenFile(path: tokenPath, codec: codec) }

    private func temporaryName(pid: Int32? = nil, counter: UInt32 = 12345) -> String { ".tokens.json.tmp-\(pid ?? deadPID)-\(counter)" }

    /// Writes `data` as a leftover of ours (0600, as `TokenFile.write` creates it).
    @discardableResult
    private func leave(_ data: Data, name: String? = nil) throws -> String {
        let path = directory.appendingPathComponent(name ?? temporaryName()).path
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600]))
        return path
    }

    private func recordInFlight(_ refreshToken: String) throws {
        try RefreshInFlightMarker(tokenFilePath: tokenPath).writer(for: RefreshInFlightRecord(refreshToken: refreshToken, sentAt: Date()))()
    }

    private var markerExists: Bool { FileManager.default.fileExists(atPath: RefreshInFlightMarker.path(forTokenFile: tokenPath)) }
    private func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    func testTheAnswerToTheRefreshInFlightIsPutInPlaceAndTheRecordRemoved() throws {
        try file().write(burnt)
        try recordInFlight("burnt-refresh-BBBB")
        XCTAssertFalse(TokenFileLeftovers(file: file()).anyLeft(isAlive: noneAlive))
        let leftover = try leave(try file().encode(rotated))
        XCTAssertTrue(TokenFileLeftovers(file: file()).anyLeft(isAlive: noneAlive))
        XCTAssertFalse(TokenFileLeftovers(file: file()).anyLeft(isAlive: { _ in true }), "a live writer's file is not left over")
        let findings = TokenFileLeftovers(file: file()).settle(isAlive: noneAlive)
        XCTAssertEqual(findings, [.adopted(temporaryName())])
        XCTAssertEqual(try file().load().refreshToken, "rotated-refresh-DDDD")
        XCTAssertEqual(try file().load().accessToken, "new-access-CCCC")
        XCTAssertFalse(exists(leftover))
        XCTAssertFalse(markerExists, "the refresh it answers is over")
        XCTAssertNoThrow(try file().checkPermissions())
    }

    func testATemporaryFileAnsweringAnotherRefreshIsRemovedAndTheTokenFileKept() throws {
        try file().write(burnt)
        try recordInFlight("some-other-refresh-EEEE")  // the record names a refresh token the file does not hold
        let leftover = try leave(try file().encode(rotated))
        XCTAssertEqual(TokenFileLeftovers(file: file()).settle(isAlive: noneAlive).map(Self.kind), ["removed"])
        XCTAssertEqual(try file().load().refreshToken, "burnt-refresh-BBBB")
        XCTAssertFalse(exists(leftover))
        XCTAssertTrue(markerExists, "the hold-off stays")
    }

    func testWithoutARecordOrWithTheSameRefreshTokenNothingIsAdopted() throws {
        try file().write(burnt)
        try leave(try file().encode(rotated))
        XCTAssertEqual(TokenFileLeftovers(file: file()).settle(isAlive: noneAlive).map(Self.kind), ["removed"], "no refresh was in flight")
        XCTAssertEqual(try file().load().refreshToken, "burnt-refresh-BBBB")

        try recordInFlight("burnt-refresh-BBBB")
        try leave(try file().encode(TokenSet(accessToken: "other-access-FFFF", refreshToken: "burnt-refresh-BBBB")))
        XCTAssertEqual(TokenFileLeftovers(file: file()).settle(isAlive: noneAlive).map(Self.kind), ["removed"],
                       "the same refresh token: not a rotation's answer")
        XCTAssertEqual(try file().load().accessToken, "old-access-AAAA")
    }

    func testGarbageAndTruncatedTemporaryFilesAreRemovedAndTheTokenFileUntouched() throws {
        try file().write(burnt)
        try recordInFlight("burnt-refresh-BBBB")
        let before = try Data(contentsOf: URL(fileURLWithPath: tokenPath))
        let whole = try file().encode(rotated)
        let truncated = try leave(whole.prefix(whole.count / 2), name: temporaryName(counter: 1))
        let garbage = try leave(Data("not json at all".utf8), name: temporaryName(counter: 2))
        let empty = try leave(Data(), name: temporaryName(counter: 3))
        let findings = TokenFileLeftovers(file: file()).settle(isAlive: noneAlive)
        XCTAssertEqual(findings.map(Self.kind), ["removed", "removed", "removed"])
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: tokenPath)), before)
        for path in [truncated, garbage, empty] { XCTAssertFalse(exists(path), path) }
        XCTAssertTrue(markerExists)
    }

    func testALiveWritersFileAndFilesNotOfOurNamingAreNeverTouched() throws {
        try file().write(burnt)
        try recordInFlight("burnt-refresh-BBBB")
        let live = try leave(try file().encode(rotated), name: temporaryName(pid: 4242))
        let foreign = [".tokens.json.tmp-x-1", ".tokens.json.tmp-1", ".tokens.json.tmp-1-2-3", "tokens.json.tmp-1-2",
                       ".other.json.tmp-\(deadPID)-1", ".tokens.json.refreshing.tmp-\(deadPID)-1"]
        let foreignPaths = try foreign.map { try leave(try file().encode(rotated), name: $0) }
        XCTAssertEqual(TokenFileLeftovers(file: file()).settle(isAlive: { $0 == 4242 }), [])
        XCTAssertEqual(try file().load().refreshToken, "burnt-refresh-BBBB")
        for path in [live] + foreignPaths { XCTAssertTrue(exists(path), path) }
        XCTAssertTrue(TokenFileLeftovers.isProcessAlive(getpid()))
        XCTAssertFalse(TokenFileLeftovers.isProcessAlive(deadPID))
    }

    func testSealedTheTagMustVerifyAndTheStateBeBoundToThisFile() throws {
        let key = SealingKey(bytes: Array(repeating: 0xA1, count: 32))
        let sealed = TokenStateCodec(sealer: TokenSealer(SealingKeyring(current: key, previous: [])), place: .tokenFile)
        let otherPlace = TokenStateCodec(sealer: TokenSealer(SealingKeyring(current: key, previous: [])), place: .identityTokenFile(name: "hr"))
        let otherKey = TokenStateCodec(sealer: TokenSealer(SealingKeyring(current: SealingKey(bytes: Array(repeating: 0xB2, count: 32)), previous: [])),
                                       place: .tokenFile)
        try file(sealed).write(burnt)
        try recordInFlight("burnt-refresh-BBBB")
        var altered = try file(sealed).encode(rotated)
        altered[altered.count / 2] ^= 0x01
        let refused = [try leave(try otherPlace.encode(rotated), name: temporaryName(counter: 1)),
                       try leave(try otherKey.encode(rotated), name: temporaryName(counter: 2)),
                       try leave(altered, name: temporaryName(counter: 3))]
        XCTAssertEqual(TokenFileLeftovers(file: file(sealed)).settle(isAlive: noneAlive).map(Self.kind), ["removed", "removed", "removed"])
        XCTAssertEqual(try file(sealed).load().refreshToken, "burnt-refresh-BBBB")
        for path in refused { XCTAssertFalse(exists(path), path) }

        try leave(try file(sealed).encode(rotated), name: temporaryName(counter: 4))
        XCTAssertEqual(TokenFileLeftovers(file: file(sealed)).settle(isAlive: noneAlive), [.adopted(temporaryName(counter: 4))])
        let (loaded, form) = try file(sealed).loadWithForm()
        XCTAssertEqual(loaded.refreshToken, "rotated-refresh-DDDD")
        XCTAssertEqual(form, .sealed(keyID: key.id))
        XCTAssertFalse(markerExists)
    }

    /// The writer puts its temporary file beside a symlink's final target: it is looked for there, and the
    /// link stays a link.
    func testThroughASymlinkTheLeftoverBesideTheTargetIsAdopted() throws {
        let real = directory.appendingPathComponent("real")
        try FileManager.default.createDirectory(at: real, withIntermediateDirectories: true)
        let link = directory.appendingPathComponent("link.json").path
        XCTAssertEqual(symlink("real/tokens.json", link), 0)
        let linked = TokenFile(path: link)
        try linked.write(burnt)
        try RefreshInFlightMarker(tokenFilePath: link).writer(for: RefreshInFlightRecord(refreshToken: "burnt-refresh-BBBB", sentAt: Date()))()
        let leftover = real.appendingPathComponent(temporaryName()).path
        XCTAssertTrue(FileManager.default.createFile(atPath: leftover, contents: try linked.encode(rotated), attributes: [.posixPermissions: 0o600]))
        XCTAssertEqual(TokenFileLeftovers(file: linked).settle(isAlive: noneAlive), [.adopted(temporaryName())])
        XCTAssertEqual(try linked.load().refreshToken, "rotated-refresh-DDDD")
        XCTAssertEqual(try FileManager.default.destinationOfSymbolicLink(atPath: link), "real/tokens.json")
        XCTAssertFalse(exists(leftover))
        XCTAssertFalse(FileManager.default.fileExists(atPath: RefreshInFlightMarker.path(forTokenFile: link)))
    }

    func testTwoAnswersToOneRefreshAreBothLeftAlone() throws {
        try file().write(burnt)
        try recordInFlight("burnt-refresh-BBBB")
        let first = try leave(try file().encode(rotated), name: temporaryName(counter: 1))
        let second = try leave(try file().encode(TokenSet(accessToken: "x-access-GGGG", refreshToken: "x-refresh-HHHH")), name: temporaryName(counter: 2))
        XCTAssertEqual(TokenFileLeftovers(file: file()).settle(isAlive: noneAlive).map(Self.kind), ["kept", "kept"])
        XCTAssertEqual(try file().load().refreshToken, "burnt-refresh-BBBB")
        XCTAssertTrue(exists(first) && exists(second))
    }

    private static func kind(_ finding: TokenFileLeftovers.Finding) -> String {
        switch finding {
        case .adopted: return "adopted"
        case .removed: return "removed"
        case .kept: return "kept"
        }
    }
}

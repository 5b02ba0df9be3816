import Foundation
import XCTest

final class TokenPersistenceTests: RelayTestCase {
    func testRefreshedTokensArePersistedWholeAndPrivate() throws {
        let relay = try startRelay()
        // A reader that keeps parsing the file while refreshes replace it: it must never see half a file.
        let stop = Locked(false)
        let tornReads = Locked(0)
        let reads = Locked(0)
        let path = tokenFileURL.path
        let reader = AsyncCall<Void> {
            while !stop.withLock({ $0 }) {
                if let data = FileManager.default.contents(atPath: path) {
                    let parsed = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
                    if parsed?["access_token"] as? String == nil { tornReads.withLock { $0 += 1 } }
                    reads.withLock { $0 += 1 }
                }
            }
        }
        for round in 1...5 {
            tokenServer.expireAccessTokens()
            XCTAssertEqual(try get(relay, "/round/\(round)").status, 200)
        }
        stop.withLock { $0 = true }
        try reader.wait(timeout: 5)

        XCTAssertEqual(tokenServer.refreshCalls, 5)
        XCTAssertEqual(tornReads.withLock { $0 }, 0, "a reader saw a half-written token file")
        XCTAssertGreaterThan(reads.withLock { $0 }, 10)
        let file = try readTokenFile()
        XCTAssertEqual(file["access_token"] as? String, tokenServer.currentAccessToken)
        XCTAssertEqual(file["refresh_token"] as? String, tokenServer.currentRefreshToken)
        XCTAssertNotNil(file["expires_at"] as? String)
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        let strays = try FileManager.default.contentsOfDirectory(atPath: workDir.path).filter { $0.hasPrefix(".tokens.json") }
        XCTAssertEqual(strays, [])
    }

    func testUnknownKeysSurviveARefresh() throws {
        var object = try readTokenFile()
        object["operator_note"] = "seeded by hand"
        try JSONSerialization.data(withJSONObject: object).write(to: tokenFileURL)
        let relay = try startRelay()
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(try readTokenFile()["operator_note"] as? String, "seeded by hand")
    }

    func testRestartUsesPersistedTokensWithoutRefreshing() throws {
        let first = try startRelay()
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(first).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(first.stop(), 0)

        let second = try startRelay()
        let responses = burst(10) { _ in try HTTPTestClient.send(port: second.proxyPort, method: "GET", path: "/after-restart") }
        XCTAssertEqual(statusCounts(responses), [200: 10])
        XCTAssertEqual(tokenServer.refreshCalls, 1, "a valid persisted token must be used as is")
        XCTAssertEqual(api.unauthorizedCount, 1, "only the first expiry produced a 401")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    func testGroupReadableTokenFileIsRefusedAtStart() throws {
        chmod(tokenFileURL.path, 0o640)
        XCTAssertThrowsError(try startRelay()) { error in
            XCTAssertTrue("\(error)".contains("chmod 600"), "\(error)")
        }
    }

    func testUnparseableTokenFileIsReportedAndNeverOverwritten() throws {
        let garbage = Data("{\"access_token\": \"abc\"".utf8)
        try garbage.write(to: tokenFileURL)
        chmod(tokenFileURL.path, 0o600)
        XCTAssertThrowsError(try startRelay()) { error in
            XCTAssertTrue("\(error)".contains(tokenFileURL.path), "\(error)")
            XCTAssertTrue("\(error)".contains("is not valid JSON"), "\(error)")
        }
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), garbage)
    }
}

/// A token file seeded by hand with only a refresh token: the access token is fetched at start.
final class RefreshTokenBootstrapTests: RelayTestCase {
    func testRefreshTokenOnlyFileIsBootstrappedAtStart() throws {
        let tokens = tokenServer.issueInitialTokens()
        try JSONSerialization.data(withJSONObject: ["refresh_token": tokens.refresh]).write(to: tokenFileURL)
        chmod(tokenFileURL.path, 0o600)
        let relay = try startRelay()
        let responses = burst(5) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/first/\(i)") }
        XCTAssertEqual(statusCounts(responses), [200: 5])
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(api.unauthorizedCount, 0, "no request goes out without a token")
        XCTAssertEqual(try readTokenFile()["access_token"] as? String, tokenServer.currentAccessToken)
    }
}

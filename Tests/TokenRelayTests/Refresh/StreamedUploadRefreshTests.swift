import Foundation
import XCTest

/// A streamed upload's 401 after its body has gone is passed to the client (the body cannot be sent
/// again), but used to start no refresh: upload after upload got 401 with the dead token until a plain
/// request happened to trigger one. It now counts for the refresh rules, coalesced as always.
final class StreamedUploadRefreshTests: RelayTestCase {
    func testFourUploadsRefusedAfterTheirBodiesStartOneRefresh() throws {
        let relay = try startRelay(["data_plane": "transport", "limits": ["max_body_bytes": 64 * 1024]])
        // Each upload is refused after its whole body arrived; the answers wait half a second, so all four
        // left with the same token before the first 401 is back.
        for _ in 0..<4 { api.forceUnauthorizedOnce(path: "/upload") }
        api.responseDelay = 0.5
        let body = Data(repeating: 0x5A, count: 1024 * 1024)
        let answers = burst(4) { _ in
            try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload",
                                    headers: [("Content-Type", "application/octet-stream")], body: body, timeout: 30)
        }
        api.responseDelay = 0
        XCTAssertEqual(answers.map(\.status), [401, 401, 401, 401], "each 401 is the client's: the bodies are gone")
        XCTAssertEqual(api.requests.filter { $0.path == "/upload" }.count, 4, "none sent again")
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.successfulRefreshes == 1 }, "the 401s started a refresh")
        XCTAssertEqual(tokenServer.refreshCalls, 1, "four refusals of one token, one refresh")
        XCTAssertEqual(try get(relay).status, 200, "the next request has the fresh token")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}

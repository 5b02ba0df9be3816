import Foundation
import XCTest

/// An upstream that answers 401 after a megabyte of a streamed upload and closes without reading the
/// rest resets the connection: the relay's next write of the body fails before the answer is read, and
/// the client gets 502 (nginx too). The log at least says that the upstream had answered 401.
final class EarlyRefusalResetTests: RelayTestCase {
    func testA401BeforeTheWholeUploadThenACloseIsNamedInTheLog() throws {
        let upstream = try rawUpstream { connection in
            guard try connection.readHead() != nil else { return }
            _ = try connection.readBody(1024 * 1024)
            try connection.write("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            // Closing with the rest of the body unread sends a reset.
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL],
                                    "limits": ["max_body_bytes": 64 * 1024],
                                    "timeouts": ["continue_seconds": 0.1]])
        let body = Data(repeating: 0x61, count: 8 * 1024 * 1024)
        let response = try? HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload",
                                                headers: [("Content-Type", "application/octet-stream")], body: body, timeout: 20)
        if response?.status == 401 { return }   // the answer was read before the write failed: relayed as it is
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("had answered 401") },
                      "status \(String(describing: response?.status)); log: \(relay.stderrText)")
    }
}

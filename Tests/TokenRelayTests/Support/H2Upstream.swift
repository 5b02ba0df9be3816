import Foundation

/// The Python HTTP/2 upstream (`Fixtures/h2_upstream.py`, Debian's python3-h2): h2c, or h2 over TLS with
/// ALPN. Its events (connections accepted, requests answered with their fields) are read from the
/// JSON-lines file it writes.
final class H2Upstream {
    struct Request {
        let connection: Int
        let stream: Int
        let fields: [(name: String, value: String)]
        let bodyBytes: Int
        let trailers: [(name: String, value: String)]

        func field(_ name: String) -> String? { fields.first { $0.name == name }?.value }
        var path: String { field(":path") ?? "" }
    }

    let process: PythonFixtureProcess
    let eventsFile: URL
    let rejectFile: URL
    var port: Int { process.ports[0] }
    var url: String { "http://127.0.0.1:\(port)" }

    init(workDir: URL, settings: [String: Any] = [:]) throws {
        let name = "h2-upstream-\(UUID().uuidString.prefix(8))"
        eventsFile = workDir.appendingPathComponent("\(name).events")
        rejectFile = workDir.appendingPathComponent("\(name).reject")
        var all = settings
        all["events_file"] = eventsFile.path
        all["reject_tokens_file"] = rejectFile.path
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/h2_upstream.py")
        process = try PythonFixtureProcess(script: script, settings: all, workDir: workDir, name: "h2_upstream", portCount: 1)
    }

    func stop() { process.stop() }

    /// Answers 401 (gRPC: status 16) to these tokens from now on.
    func reject(_ tokens: [String]) throws {
        try (tokens.joined(separator: "\n") + "\n").write(to: rejectFile, atomically: true, encoding: .utf8)
    }

    private var events: [[String: Any]] {
        let text = (try? String(contentsOf: eventsFile, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    var connectionCount: Int { events.filter { $0["event"] as? String == "connection" }.count }

    /// Requests refused (401) at their `expect: 100-continue` head, before any body.
    var refusedBeforeBodyCount: Int { events.filter { $0["event"] as? String == "refused_before_body" }.count }

    /// How often a `large_paths` response stopped for want of window (the relay held it back).
    var windowClosedCount: Int { events.filter { $0["event"] as? String == "window_closed" }.count }

    var requests: [Request] {
        events.filter { $0["event"] as? String == "request" }.map { event in
            let pairs = (event["headers"] as? [[String]] ?? []).map { (name: $0[0], value: $0[1]) }
            let trailers = (event["trailers"] as? [[String]] ?? []).map { (name: $0[0], value: $0[1]) }
            return Request(connection: event["conn"] as? Int ?? 0, stream: event["stream"] as? Int ?? 0, fields: pairs,
                           bodyBytes: event["body"] as? Int ?? 0, trailers: trailers)
        }
    }
}

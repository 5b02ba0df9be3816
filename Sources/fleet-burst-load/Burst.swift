import Glibc
import HTTPTransport

/// COUNT concurrent requests, each on its own connection (`Connection: close`, as the Python clients
/// sent them), spread round-robin over the relays' ports. Records each status and when the last response
/// ended; `finished` gets one JSON line once every request has an outcome.
final class Burst: HTTPClientConnectionHandler {
    private let loop: TransportLoop
    private let count: Int
    private let ports: [UInt16]
    private let finished: (String) -> Void
    private var connections: [ObjectIdentifier: HTTPClientConnection] = [:]
    private var statusOf: [ObjectIdentifier: Int] = [:]
    private var statuses: [Int: Int] = [:]
    private var failures: [String: Int] = [:]
    private var outstanding = 0
    private var startedAt = 0.0
    private var lastAnswerAt = 0.0
    /// When each response ended (monotonic), for the spread of the release.
    private var answerTimes: [Double] = []

    init(loop: TransportLoop, count: Int, ports: [UInt16], finished: @escaping (String) -> Void) {
        self.loop = loop
        self.count = count
        self.ports = ports
        self.finished = finished
    }

    func start() {
        startedAt = monotonicNow()
        outstanding = count
        for index in 0..<count {
            do {
                let connection = try HTTPClientConnection(loop: loop, host: "127.0.0.1", port: ports[index % ports.count], inputCapacity: 4096,
                                                          connectTimeout: 30)
                connection.handler = self
                connections[ObjectIdentifier(connection)] = connection
                connection.startRequest(method: "GET", target: Array("/burst/\(index)".utf8),
                                        fields: [("Host", "bench"), ("Connection", "close")], body: .none)
                connection.finishRequest()
            } catch {
                record(failure: "\(error)")
            }
        }
    }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        statusOf[ObjectIdentifier(connection)] = head.status
    }

    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {}

    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        let id = ObjectIdentifier(connection)
        guard connections.removeValue(forKey: id) != nil else { return }
        lastAnswerAt = monotonicNow()
        answerTimes.append(lastAnswerAt)
        statuses[statusOf.removeValue(forKey: id) ?? 0, default: 0] += 1
        connection.handler = nil
        connection.close()
        done()
    }

    func connectionCanSendMore(_ connection: HTTPClientConnection) {}

    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        let id = ObjectIdentifier(connection)
        guard connections.removeValue(forKey: id) != nil else { return }
        statusOf[id] = nil
        record(failure: "\(ended)")
    }

    private func record(failure: String) {
        failures[failure, default: 0] += 1
        done()
    }

    private func done() {
        outstanding -= 1
        guard outstanding == 0 else { return }
        let statusText = statuses.sorted { $0.key < $1.key }.map { "\"\($0.key)\": \($0.value)" }.joined(separator: ", ")
        let failureText = failures.sorted { $0.key < $1.key }.map { "\"\(escape($0.key))\": \($0.value)" }.joined(separator: ", ")
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        let cpu = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1_000_000
        let sorted = answerTimes.sorted()
        let quantiles = [0.0, 0.5, 0.9, 0.99].map { q in sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))] }
        finished("{\"statuses\": {\(statusText)}, \"failures\": {\(failureText)}, \"started\": \(startedAt), \"last\": \(lastAnswerAt), "
                 + "\"answered\": [\(quantiles.map { String($0) }.joined(separator: ", "))], \"cpu_seconds\": \(cpu)}")
    }

    private func escape(_ text: String) -> String {
        String(text.unicodeScalars.filter { $0 != "\"" && $0 != "\\" && $0.value >= 0x20 }.map(Character.init))
    }
}

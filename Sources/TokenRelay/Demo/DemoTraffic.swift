import HTTPTransport

/// Sends bursts of concurrent requests through the proxy during the demo, so that a newcomer sees
/// token expiry, one coalesced refresh and the replays without typing anything.
final class DemoTraffic {
    private let loop: TransportLoop
    private let port: Int
    private let burstSize: Int
    private var exchanges: [HTTPExchange] = []
    private var statuses: [Int] = []
    private var pending = 0
    private var burst = 0
    private var timer: TransportTimer?
    private var interval = 0.0
    var onBurstFinished: ((_ burst: Int, _ statuses: [Int]) -> Void)?

    init(loop: EventLoop, proxyPort: Int, burstSize: Int) {
        self.loop = loop.transport
        port = proxyPort
        self.burstSize = burstSize
    }

    func start(every seconds: Double) {
        interval = seconds
        timer = TransportTimer(loop: loop) { [unowned self] in self.fire() }
        timer?.schedule(after: seconds)
    }

    private func fire() {
        timer?.schedule(after: interval)
        // A burst still waiting (a held refresh) is not joined by another.
        guard pending == 0 else { return }
        exchanges = []
        statuses = []
        burst += 1
        let request = HTTPExchange.Request(host: "127.0.0.1", port: UInt16(clamping: port), method: "GET", target: "/hello",
                                           fields: [("Host", "127.0.0.1:\(port)")])
        for _ in 0..<burstSize {
            pending += 1
            exchanges.append(HTTPExchange(loop: loop, request: request, limits: HTTPExchange.Limits(timeoutSeconds: 30)) { [unowned self] result in
                self.finished(result)
            })
        }
    }

    private func finished(_ result: Result<HTTPExchange.Response, HTTPExchange.Failure>) {
        switch result {
        case .success(let response): statuses.append(response.status)
        case .failure: statuses.append(0)
        }
        pending -= 1
        if pending == 0 { onBurstFinished?(burst, statuses) }
    }

    func stop() {
        timer = nil
        exchanges.forEach { $0.cancel() }
        exchanges = []
    }
}

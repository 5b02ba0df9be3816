import CLibevent

/// Sends bursts of concurrent requests through the proxy during the demo, so that a newcomer sees
/// token expiry, one coalesced refresh and the replays without typing anything.
final class DemoTraffic: OutgoingRequestDelegate {
    private let loop: EventLoop
    private let port: Int
    private let burstSize: Int
    private var connections: [OpaquePointer] = []
    private var statuses: [Int] = []
    private var pending = 0
    private var burst = 0
    private var timer: LoopEvent?
    var onBurstFinished: ((_ burst: Int, _ statuses: [Int]) -> Void)?

    init(loop: EventLoop, proxyPort: Int, burstSize: Int) {
        self.loop = loop
        port = proxyPort
        self.burstSize = burstSize
    }

    func start(every seconds: Double) {
        let timer = LoopEvent(loop: loop, events: Int32(EV_PERSIST)) { [unowned self] _ in self.fire() }
        timer.schedule(after: seconds)
        self.timer = timer
    }

    private func fire() {
        guard pending == 0 else { return }
        // Connections of the previous burst are finished with; freeing them here, never inside their
        // own callbacks, is what evhttp requires.
        connections.forEach { evhttp_connection_free($0) }
        connections = []
        statuses = []
        burst += 1
        for _ in 0..<burstSize {
            guard let connection = evhttp_connection_base_new(loop.base, nil, "127.0.0.1", UInt16(port)) else { continue }
            connections.append(connection)
            let call = OutgoingRequest(delegate: self)
            pending += 1
            let started = call.start(on: connection, method: EVHTTP_REQ_GET, target: "/hello") { request in
                let headers = HeaderList(raw: evhttp_request_get_output_headers(request))
                headers.add("Host", "127.0.0.1:\(port)")
            }
            if !started { pending -= 1 }
        }
    }

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {}

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        let input = evhttp_request_get_input_buffer(response)
        evbuffer_drain(input, EvBuffer.length(input))
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        switch result {
        case .success(let response): statuses.append(Int(evhttp_request_get_response_code(response)))
        case .failure: statuses.append(0)
        }
        pending -= 1
        if pending == 0 { onBurstFinished?(burst, statuses) }
    }

    func stop() {
        timer = nil
        connections.forEach { evhttp_connection_free($0) }
        connections = []
    }
}

import Foundation

/// A fake RFC 8628 identity provider: `POST /device` hands out a device code, `POST /token` answers the
/// device-code polls from a script (`authorization_pending`, `slow_down`, … and finally tokens). Every
/// request is recorded with the time it arrived, so tests can check the poll spacing.
final class FakeDeviceAuthorizationServer: @unchecked Sendable { // @unchecked: `http` is set once in init
    enum PollAnswer: Sendable {
        case error(String, status: Int = 400, description: String? = nil)
        case tokens(access: String, refresh: String?, expiresIn: Double?)

        static let pending = PollAnswer.error("authorization_pending")
        static let slowDown = PollAnswer.error("slow_down")
    }

    struct Arrival: Sendable {
        let request: RecordedRequest
        /// Seconds on a monotonic clock.
        let time: Double
    }

    static let deviceCode = "device-code-secret-5d1e8b"
    static let userCode = "WDJB-MJHT"

    private struct State {
        var deviceResponse: [String: any Sendable] = [:]
        var script: [PollAnswer] = []
        var arrivals: [Arrival] = []
    }

    private let state = Locked(State())
    private var http: MiniHTTPServer!

    var deviceAuthorizationURL: String { http.baseURL + "/device" }
    var tokenURL: String { http.baseURL + "/token" }
    var verificationURI: String { http.baseURL + "/activate" }

    /// `interval` and `expiresIn` go into the device authorization response as given (nil: omitted).
    init(script: [PollAnswer], interval: Double? = 1, expiresIn: Double = 600) throws {
        http = try MiniHTTPServer { [unowned self] request in self.handle(request) }
        var device: [String: any Sendable] = ["device_code": Self.deviceCode, "user_code": Self.userCode,
                                              "verification_uri": verificationURI,
                                              "verification_uri_complete": verificationURI + "?user_code=" + Self.userCode,
                                              "expires_in": expiresIn]
        if let interval { device["interval"] = interval }
        state.withLock {
            $0.deviceResponse = device
            $0.script = script
        }
    }

    func stop() { http.stop() }

    var arrivals: [Arrival] { state.withLock { $0.arrivals } }
    var polls: [Arrival] { arrivals.filter { $0.request.path == "/token" } }

    private func handle(_ request: RecordedRequest) -> TestResponse {
        state.withLock { state in
            state.arrivals.append(Arrival(request: request, time: ProcessInfo.processInfo.systemUptime))
            switch request.path {
            case "/device":
                return .json(200, state.deviceResponse)
            case "/token":
                guard FakeTokenServer.parseForm(request.bodyText)["device_code"] == Self.deviceCode else { return .json(400, ["error": "invalid_grant"]) }
                // The last answer repeats once the script is used up.
                let answer = state.script.count > 1 ? state.script.removeFirst() : state.script[0]
                switch answer {
                case let .error(code, status, description):
                    var body = ["error": code]
                    body["error_description"] = description
                    return .json(status, body)
                case let .tokens(access, refresh, expiresIn):
                    var body: [String: Any] = ["access_token": access, "token_type": "Bearer", "id_token": "id-token-not-stored"]
                    body["refresh_token"] = refresh
                    body["expires_in"] = expiresIn
                    return .json(200, body)
                }
            default:
                return TestResponse(status: 404)
            }
        }
    }
}

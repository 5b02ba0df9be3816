/// How a request ends other than by relaying its answer: the client gone, shutdown, and the answers the
/// machine makes itself (a local response, the captured one, the finish). Apart from `RequestLifecycle.swift`
/// so each stage reads alone.
extension RequestLifecycle {
    // MARK: - The client, and shutdown

    /// The status reported (access log, request metric) for a request whose client left before it was
    /// answered: nginx's 499, so that one count means the same in both (no such status is ever sent).
    static let clientClosedRequest = 499

    /// The client hung up (or its connection failed): nobody is left to answer.
    mutating func clientGone(now: Double) -> ActionList {
        guard phase != .finished else { return ActionList() }
        let wasHeld = phase == .held
        if answeredStatus == 0 {
            clientLeftUnanswered = true
            answeredStatus = Self.clientClosedRequest
        }
        return ActionList(.cancelUpstream) + (wasHeld ? ActionList(.unhold) : ActionList()) + ActionList(finish(now: now))
    }

    /// The drain deadline passed at shutdown.
    mutating func abandon(now: Double) -> ActionList {
        switch phase {
        case .finished: return ActionList()
        case .relaying: return ActionList(.cancelUpstream, .abortClient(flushFirst: false), finish(now: now))
        case .held: return ActionList(.unhold, .cancel(.hold)) + respond(.unavailable("tokenrelay is shutting down"), now: now)
        default: return ActionList(.cancelUpstream) + respond(.unavailable("tokenrelay is shutting down"), now: now)
        }
    }

    // MARK: - Answers

    mutating func respond(_ response: LocalResponse, now: Double) -> ActionList {
        answeredStatus = Int(response.status)
        answeredByUpstream = false
        return ActionList(.respond, finish(now: now)).answering(response)
    }

    mutating func respondCaptured(now: Double) -> ActionList {
        answeredStatus = capturedStatus ?? 401
        answeredByUpstream = false
        return ActionList(.respondCaptured, finish(now: now))
    }

    mutating func finish(now: Double) -> Action {
        phase = .finished
        var summary = Summary(status: answeredStatus, attempts: attempts, generation: sentGeneration)
        if let since = heldSince {
            let outcome: HoldOutcome = switch answeredStatus {
            case _ where clientLeftUnanswered: .clientGone
            case _ where answeredByUpstream: .replayed
            case 503: .unavailable
            case 401: .unauthorized
            case _ where capturedGRPCRefusal: .unauthorized
            default: .other
            }
            summary.hold = (max(0, now - since), outcome)
        }
        self.summary = summary
        return .finish
    }
}

import CLibevent
import HTTPWire
import Glibc

/// The connection's two timers: the activity timer (idle keep-alive and stalled body limits) and the
/// head timer (a whole head within `headTimeout` of its first byte), and what the server's connection
/// limit asks about a stalled head. Apart from `HTTPServerConnection.swift` because each costs a request
/// nothing unless it fires; the rules for when they are armed read best together.
extension HTTPServerConnection {
    /// Schedules the activity timer for the limit the current state is under. In other states (a request
    /// waiting for its response: how long the handler takes is the handler's business; reading paused by
    /// the handler) a pending expiry is left alone and ignored when it fires, which saves a timer change
    /// per request; the next state that has a limit re-arms it.
    func armActivityTimer() {
        guard let activityTimer, !hasEnded else { return }
        let limit: Double
        switch readState {
        case .head where idleTimeout > 0: limit = idleTimeout
        case .lengthBody where bodyTimeout > 0 && !readingPausedByHandler, .chunkedBody where bodyTimeout > 0 && !readingPausedByHandler:
            limit = bodyTimeout
        default:
            return
        }
        // An earlier expiry already pending serves as well: it finds the connection not quiet long enough
        // and re-arms for the rest. A keep-alive client then costs no timer change per request.
        let expiry = quietSince + limit
        if activityExpiry <= expiry { return }
        var tv = clampedTimeval(expiry - monotonicSeconds())
        event_add(activityTimer, &tv)
        activityExpiry = expiry
    }

    func activityTimerFired() {
        activityExpiry = .infinity
        guard !hasEnded else { return }
        let quiet = monotonicSeconds() - quietSince
        switch readState {
        case .head where idleTimeout > 0:
            if responseFraming != nil || stream.pendingOutput > 0 {
                // The last answer is still going out: idleness starts when it is gone.
                quietSince = monotonicSeconds()
            } else if stream.input.count > 0 && headTimeout > 0 {
                return   // a head in progress: the head timeout bounds it
            } else if quiet >= idleTimeout {
                readState = .ended
                disarmHeadTimer()
                end(.idleTimeout)
                stream.close()
                return
            }
            armActivityTimer()
        case .lengthBody, .chunkedBody:
            guard bodyTimeout > 0, !readingPausedByHandler else { return }
            if quiet >= bodyTimeout {
                refuse(status: 408, reason: "Request Timeout", message: "request body stalled", end: .timedOut)
                return
            }
            armActivityTimer()
        default:
            return
        }
    }

    /// For tests: the head timer has been made (with the first byte of a head that came in parts).
    var holdsHeadTimer: Bool { headTimer != nil }

    /// The whole head must arrive within `headTimeout` of its first byte, however the bytes trickle in: a
    /// client sending one byte a second would otherwise hold a connection (and a slot) for as long as it
    /// likes. A timer is a heap entry in libevent, not an epoll change, so arming it per request is cheap.
    func armHeadTimer() {
        guard headTimeout > 0, !headTimerArmed else { return }
        if headTimer == nil {
            headTimer = event_new(loopBase, -1, 0, headTimerTrampoline, Unmanaged.passUnretained(self).toOpaque())
        }
        guard let headTimer else { return }
        headTimerArmed = true
        headStartedAt = monotonicSeconds()
        let whole = headTimeout.rounded(.down)
        var tv = timeval(tv_sec: Int(whole), tv_usec: Int((headTimeout - whole) * 1_000_000))
        event_add(headTimer, &tv)
    }

    func disarmHeadTimer() {
        guard let headTimer, headTimerArmed else { return }
        headTimerArmed = false
        headStartedAt = .infinity
        event_del(headTimer)
    }

    /// A request head began arriving at least `grace` seconds ago and is still incomplete, with nothing
    /// being answered. A real client sends its head at once, so at the connection limit such a connection
    /// is the first to make room: otherwise a few connections trickling heads (each within the head
    /// timeout) would hold every slot and lock real clients out for as long as they keep reconnecting.
    func headStalled(now: Double, grace: Double) -> Bool {
        guard headTimerArmed, !hasEnded, case .head = readState, responseFraming == nil, stream.pendingOutput == 0 else { return false }
        return now - headStartedAt >= grace
    }

    /// When the head started arriving (see `headStalled`).
    var headStartTime: Double { headStartedAt }

    /// Answers 408 to a stalled head and closes at once: the slot must be free when this returns.
    func closeStalledHead() {
        refuse(status: 408, reason: "Request Timeout", message: "request head not received in time", end: .headTimeout, lingering: false)
    }

    func headTimerFired() {
        headTimerArmed = false
        guard !hasEnded, case .head = readState, stream.input.count > 0 else { return }
        refuse(status: 408, reason: "Request Timeout", message: "request head not received in time", end: .headTimeout)
    }
}

let activityTimerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let connection = Unmanaged<HTTPServerConnection>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.activityTimerFired() }
}

let headTimerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let connection = Unmanaged<HTTPServerConnection>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.headTimerFired() }
}

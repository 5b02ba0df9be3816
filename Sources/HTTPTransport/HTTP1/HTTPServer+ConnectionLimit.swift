import CLibevent
import CTransportSocket
import HTTPWire
import Glibc

/// The connection limit (see `HTTPServer`, rule by rule): admitting within it, accepting over it, making
/// room by closing an idle connection or a stalled head, the sweep that promotes waiting connections, and
/// pausing accepting. Apart from `HTTPServer.swift` (the listener: accept, stop, close) because the limit's
/// rules read best together and touch a connection only at its accept and its close.
extension HTTPServer {
    var hasLimit: Bool { settings.maxConnections > 0 }

    /// While a connection waits for a slot (on any listener of the group), responses close their connection afterwards.
    var wantsSlotsBack: Bool { limitGroup.waitingConnections > 0 }

    // The counts of the group (see `ConnectionLimitGroup`): one listener's rules act on all of its members.
    var withinLimit: Int {
        get { limitGroup.withinLimit }
        set { limitGroup.withinLimit = newValue }
    }
    var overLimit: Int {
        get { limitGroup.overLimit }
        set { limitGroup.overLimit = newValue }
    }
    private var waiting: Int {
        get { limitGroup.waitingConnections }
        set { limitGroup.waitingConnections = newValue }
    }
    var makingRoom: Bool {
        get { limitGroup.makingRoom }
        set { limitGroup.makingRoom = newValue }
    }

    func admit(_ connection: HTTPServerConnection) {
        guard hasLimit else {
            withinLimit += 1
            return
        }
        // Those already waiting come first; an idle slot goes to them in `sweep`.
        if withinLimit >= settings.maxConnections && settings.evictsQuietAtOnce {
            closeIdleConnection(grace: 0, acceptedBefore: batchStart)
        } else if withinLimit >= settings.maxConnections && waiting == 0 {
            closeIdleConnection(grace: settings.idleGrace)
        }
        if withinLimit < settings.maxConnections {
            withinLimit += 1
        } else {
            connection.isOverLimit = true
            overLimit += 1
            waiting += 1
            onLimitEvent?(.acceptedOverLimit)
            scheduleSweep()
        }
    }

    /// The socket of `connection` is closed.
    func closed(_ connection: HTTPServerConnection) {
        guard connections.removeValue(forKey: ObjectIdentifier(connection)) != nil else { return }
        if connection.isOverLimit {
            overLimit -= 1
            if !connection.isRefusedOverLimit { waiting -= 1 }
        } else {
            withinLimit -= 1
            if !makingRoom { promoteLongestWaiting() }
        }
        updateAcceptingInGroup()
    }

    /// An over-limit connection has a request head: whether it may be served (it took a slot) or must be
    /// refused. A request in hand proves a real client, so a connection quiet for half the grace makes
    /// way for it (the sweep that let this one in may have run a moment before others reached the grace).
    func admitRequest(on connection: HTTPServerConnection) -> Bool {
        guard connection.isOverLimit else { return true }
        closeIdleConnection(grace: settings.evictsQuietAtOnce ? 0 : settings.idleGrace / 2)
        if withinLimit < settings.maxConnections || !hasLimit {
            promote(connection)
            return true
        }
        connection.isRefusedOverLimit = true
        waiting -= 1
        onLimitEvent?(.refused)
        return false
    }

    func limitsChanged() {
        // A lower limit is reached as connections close (none is cut for it); a higher one lets waiting
        // connections in at once.
        if !hasLimit {
            for connection in limitGroup.connections where connection.isOverLimit && !connection.isRefusedOverLimit { promote(connection) }
        }
        while waiting > 0, withinLimit < settings.maxConnections, promoteLongestWaiting() {}
        updateAcceptingInGroup()
        scheduleSweep()
    }

    /// Closes the within-limit connection idle the longest, if any, else the one whose request head has
    /// been trickling in the longest (past the grace); its slot goes to the caller's connection.
    private func closeIdleConnection(grace: Double, acceptedBefore batch: UInt64 = .max) {
        let now = monotonicSeconds()
        let atOnce = settings.evictsQuietAtOnce
        if let idle = longestQuiet(now: now, grace: grace, where: { !$0.isOverLimit && $0.sequence < batch && $0.isIdle && !(atOnce && $0.hasUnreadBytes) }) {
            onLimitEvent?(.closedIdle)
            makingRoom = true
            idle.close()   // reports the close synchronously: `closed` frees its slot
            makingRoom = false
        } else if let stalled = longestStalledHead(now: now, grace: grace, overLimit: false), stalled.sequence < batch, !(atOnce && stalled.hasUnreadBytes) {
            onLimitEvent?(.closedStalledHead)
            makingRoom = true
            stalled.closeStalledHead()   // closes at once, like `close`
            makingRoom = false
        }
    }

    private func longestStalledHead(now: Double, grace: Double, overLimit: Bool) -> HTTPServerConnection? {
        var found: HTTPServerConnection?
        for candidate in limitGroup.connections where candidate.isOverLimit == overLimit && candidate.headStalled(now: now, grace: grace) {
            if found.map({ candidate.headStartTime < $0.headStartTime }) ?? true { found = candidate }
        }
        return found
    }

    /// Whether a within-limit connection could make room now (idle, or its head stalled).
    private func canMakeRoom(now: Double, grace: Double) -> Bool {
        longestQuiet(now: now, grace: grace, where: { !$0.isOverLimit && $0.isIdle }) != nil
            || longestStalledHead(now: now, grace: grace, overLimit: false) != nil
    }

    private func longestQuiet(now: Double, grace: Double, where condition: (HTTPServerConnection) -> Bool) -> HTTPServerConnection? {
        var found: HTTPServerConnection?
        for candidate in limitGroup.connections where now - candidate.quietSince >= grace && condition(candidate) {
            if found.map({ candidate.quietSince < $0.quietSince }) ?? true { found = candidate }
        }
        return found
    }

    @discardableResult
    private func promoteLongestWaiting() -> Bool {
        guard waiting > 0, withinLimit < settings.maxConnections || !hasLimit else { return false }
        var oldest: HTTPServerConnection?
        for candidate in limitGroup.connections where candidate.isOverLimit && !candidate.isRefusedOverLimit {
            if oldest.map({ candidate.sequence < $0.sequence }) ?? true { oldest = candidate }
        }
        guard let oldest else { return false }
        promote(oldest)
        return true
    }

    private func promote(_ connection: HTTPServerConnection) {
        connection.isOverLimit = false
        overLimit -= 1
        waiting -= 1
        withinLimit += 1
    }

    /// Runs while connections wait or accepting is paused: frees the slots that time has made idle.
    func sweep() {
        let now = monotonicSeconds()
        let grace = settings.idleGrace
        while waiting > 0, withinLimit >= settings.maxConnections, canMakeRoom(now: now, grace: grace) {
            closeIdleConnection(grace: grace)
            promoteLongestWaiting()
        }
        // At the hard bound, waiting connections that have said nothing, or whose head has been trickling in
        // past the grace, make way for the backlog.
        while !isAccepting, limitGroup.openConnections >= hardBound {
            if let silent = longestQuiet(now: now, grace: grace, where: { $0.isOverLimit && $0.isIdle }) {
                onLimitEvent?(.closedIdle)
                silent.close()
            } else if let stalled = longestStalledHead(now: now, grace: grace, overLimit: true) {
                onLimitEvent?(.closedStalledHead)
                stalled.closeStalledHead()
            } else {
                break
            }
        }
        scheduleSweep()
    }

    private func scheduleSweep() {
        // Not re-armed while pending: a stream of arrivals would otherwise keep pushing it back.
        guard waiting > 0 || !isAccepting, let sweepTimer, !sweepTimer.isScheduled else { return }
        sweepTimer.schedule(after: settings.idleGrace / 2)
    }

    var hardBound: Int { settings.maxConnections + settings.effectiveOverLimitAllowance }

    /// At the hard bound with `evictsQuietAtOnce`: closes the connection quiet the longest (silent, or
    /// trickling a head), waiting or in a slot, accepted before `batch`. A slot it held goes to the
    /// longest waiting connection. False if none is quiet.
    func closeQuietest(acceptedBefore batch: UInt64) -> Bool {
        let now = monotonicSeconds()
        let idle = longestQuiet(now: now, grace: 0, where: { $0.sequence < batch && !$0.isRefusedOverLimit && $0.isIdle && !$0.hasUnreadBytes })
        var stalled: HTTPServerConnection?
        for overLimit in [true, false] {
            if let candidate = longestStalledHead(now: now, grace: 0, overLimit: overLimit), candidate.sequence < batch, !candidate.hasUnreadBytes,
               stalled.map({ candidate.headStartTime < $0.headStartTime }) ?? true {
                stalled = candidate
            }
        }
        if let idle, stalled.map({ idle.quietSince <= $0.headStartTime }) ?? true {
            onLimitEvent?(.closedIdle)
            idle.close()
        } else if let stalled {
            onLimitEvent?(.closedStalledHead)
            stalled.closeStalledHead()
        } else {
            return false
        }
        return true
    }

    /// Whether any connection is quiet now (see `closeQuietest`).
    private var hasQuietConnection: Bool {
        limitGroup.connections.contains { !$0.isRefusedOverLimit && ($0.isIdle || $0.headStalled(now: .infinity, grace: 0)) }
    }

    /// Every member's accepting follows the group's open connections.
    func updateAcceptingInGroup() {
        for member in limitGroup.members { member.server.updateAccepting() }
    }

    func updateAccepting() {
        var shouldAccept = !hasLimit || limitGroup.openConnections < hardBound
        // With `evictsQuietAtOnce` a quiet connection makes room for the next arrival instead.
        if !shouldAccept && settings.evictsQuietAtOnce { shouldAccept = hasQuietConnection }
        guard shouldAccept != isAccepting, let acceptEvent else { return }
        isAccepting = shouldAccept
        if shouldAccept {
            event_add(acceptEvent, nil)
        } else {
            event_del(acceptEvent)
            onLimitEvent?(.pausedAccepting)
            scheduleSweep()
        }
    }
}

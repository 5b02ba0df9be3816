import HTTPTransport
import HTTPWire

/// How an exchange carries out its machine: one event in, the machine's actions performed in order, and its
/// deadlines as timers. Part of `RelayedExchange` (RelayedExchange.swift: state, arrival, the client side).
extension RelayedExchange {
    // MARK: - Carrying out the machine's actions

    /// Feeds one event to the machine and carries out what it decides. The machine (a plain value) steps
    /// on a copy that is stored back before any action runs: the stored property is only ever read or
    /// assigned whole, never accessed across a call, so the compiler can prove its accesses exclusive and
    /// does not check them at run time on every event.
    ///
    /// `arriving`: the response head the event reports, for the one action that uses it (`relayResponse`
    /// or `captureResponse`). Passed along, not stored: valid during its callback only, and a stored
    /// optional head would cost a copy in and two generic destroys on every response.
    func step(arriving head: ReceivedResponseHead? = nil, _ event: (inout RequestLifecycle) -> RequestLifecycle.ActionList) {
        var machine = lifecycle
        let actions = event(&machine)
        lifecycle = machine
        execute(actions, arriving: head)
    }

    /// Actions that wait behind a running batch run after the callback that reported `head`: they see no
    /// head (the machine asks for it only in the step of `responseHead`).
    private func execute(_ actions: consuming RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        guard queue.begin() else {
            // Joined and dropped here, outside the accesses to `queue` (see `LifecycleActionQueue`).
            var actions = actions
            if queue.hasWaiting {
                var waiting = queue.takeWaiting()
                waiting += actions
                swap(&waiting, &actions)
            }
            return queue.wait(&actions)
        }
        performEach(actions, arriving: head)
        while let batch = queue.next() { performEach(batch, arriving: head) }
    }

    private func performEach(_ actions: consuming RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        // By index: an iterator would copy the whole list (actions are plain bytes now, so taking one is a copy).
        for index in 0..<actions.count {
            let action = actions.take(at: index)
            if queue.admits(action) { perform(action, of: actions, arriving: head) }
        }
    }

    /// `list`: the list the action came in, for what it names but does not carry (`answer`, `failure`).
    private func perform(_ action: RequestLifecycle.Action, of list: borrowing RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        switch action {
        case .acquireConnection(let admittedEarlier): acquireConnection(lane: admittedEarlier ? .admitted : .arriving, fresh: false)
        case .acquireFreshConnection: acquireConnection(lane: .admitted, fresh: true)
        case .resendWithFreshProof:
            context.dpop?.countNonceReplay()
            acquireConnection(lane: .admitted, fresh: false)
        case .cancelConnectionWait:
            ticket?.cancel()
            ticket = nil
            http2?.cancelWait()
        case .send(let credential): send(credential)
        case .cancelUpstream: closeUpstream()
        case .releaseConnection: releaseUpstream()
        case .schedule(let timer, let seconds): schedule(timer, after: seconds)
        case .cancel(let timer): self.timer(timer)?.cancel()
        case .hold, .unhold, .consultRefreshRules, .reportUnreplayableRefreshTrigger, .countReplay, .upstreamFailed, .retrying:
            switch proxy.carryOut(action, failure: list.failure, for: self, context: context) {
            case .done: break
            case .holdRefused:
                let now = EventLoop.monotonicNow
                step { $0.holdRefused(now: now) }
            case .refreshRulesDecided(let decision):
                let now = EventLoop.monotonicNow
                step { $0.refreshRulesDecided(decision, now: now) }
            }
        case .captureResponse:
            if let head { captured = CapturedResponse(head: head) }
            // The 401 is read to its end before anything is decided: silence mid-body is bounded as when
            // relaying, or a stalled upstream would keep the client (and the connection) for ever.
            upstream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
            http2?.stream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
        case .relayResponse:
            if let head { startRelaying(head) }
        case .endRelayedResponse:
            if let trailers = http2?.trailers, !trailers.isEmpty { client.finishResponse(trailers: trailers) } else { client.finishResponse() }
        case .respondCaptured: respondCaptured()
        case .respond:
            if let answer = list.answer { respond(answer) }
        case .abortClient: client.close()
        case .finish:
            // Set by the step that yielded `finish`; the machine takes no event after it.
            if let summary = lifecycle.summary { finish(summary) }
        }
    }

    private func schedule(_ timer: RequestLifecycle.Timer, after seconds: Double) {
        if let event = self.timer(timer) { return event.schedule(after: seconds) }
        let event = session.lendDeadlineTimer()
        event.exchange = self
        event.kind = timer
        switch timer {
        case .poolWait: poolWaitTimer = event
        case .connect: connectTimer = event
        case .responseHead: responseHeadTimer = event
        case .hold: holdTimer = event
        }
        event.schedule(after: seconds)
    }

    private func timer(_ timer: RequestLifecycle.Timer) -> DeadlineTimer? {
        switch timer {
        case .poolWait: poolWaitTimer
        case .connect: connectTimer
        case .responseHead: responseHeadTimer
        case .hold: holdTimer
        }
    }

    func deadlinePassed(_ timer: RequestLifecycle.Timer) {
        // The connect deadline bounds the connect only: a connection that is up may take its time to answer.
        if timer == .connect, upstream?.isConnected ?? true { return }
        let now = EventLoop.monotonicNow
        step { $0.timerFired(timer, now: now) }
    }
}

import FoundationEssentials
import Logging

/// Executing the machine's actions: the one queue, each action carried out (timers, the lock, the token
/// endpoint, the store), store reads fed back as events, and the metrics the machine asks for. Apart from
/// the questions the proxy asks (`RefreshCoordinator.swift`) because this is the half that acts.
extension RefreshCoordinator {
    // MARK: - Executing actions

    // Internal (was private): called from RefreshCoordinator.swift.
    func execute(_ actions: [RefreshMachine.Action]) {
        // Most calls (every request's admission) bring nothing: the queue is empty then, or being worked
        // through by an outer call.
        if actions.isEmpty { return }
        queue += actions
        guard !executing else { return }
        executing = true
        defer { executing = false }
        while !queue.isEmpty {
            perform(queue.removeFirst())
        }
    }

    private func perform(_ action: RefreshMachine.Action) {
        switch action {
        case .schedule(let kind, let at):
            let timer = LoopEvent(loop: loop) { [weak self] _ in
                guard let self else { return }
                // Taken out of the table while its handler runs: re-arming the same kind inside the
                // handler must not free the event that is calling us.
                let firing = self.timers.removeValue(forKey: kind)
                self.execute(self.machine.timerFired(kind, now: self.now()))
                withExtendedLifetime(firing) {}
            }
            timers[kind] = timer
            // Times can come from outside (a token's lifetime): clamped, so the conversion cannot trap. A
            // timer cut short fires early, and the machine only ever acts early on a far-away deadline.
            timer.schedule(after: min(max(0, at - EventLoop.monotonicNow), Self.longestTimer))
        case .cancel(let kind):
            timers[kind] = nil
        case .acquireLock(let timeout):
            store.acquire(timeout: timeout) { [weak self] acquired, waited in
                guard let self else { return }
                if waited { self.metrics.lockWaits.increment() }
                if acquired {
                    self.metrics.storeLockAcquisitions.increment()
                    self.store.read { read in
                        // Under the lock, what we read is what our next write replaces.
                        self.store.noteAdopted()
                        self.deliver(read, source: "lock") {
                            self.machine.lockAcquired(store: read, lockValidUntil: self.store.lockValidUntil,
                                                      inFlight: self.store.readInFlightRecord(), now: self.now())
                        }
                    }
                } else {
                    self.execute(self.machine.lockTimedOut(now: self.now()))
                }
            }
        case .releaseLock:
            store.release()
        case .presentRefreshToken(let tokens):
            endpoint.refresh(current: tokens) { [weak self] result, retryAfter in
                guard let self else { return }
                self.execute(self.machine.tokenEndpointAnswered(result, retryAfter: retryAfter, now: self.now()))
            }
        case .persist(let tokens):
            markInCache(tokens)
            write(tokens)
        case .readStore:
            store.read { [weak self] read in
                guard let self else { return }
                self.deliver(read, source: "reread") { self.machine.storeRead(read, inFlight: self.store.readInFlightRecord(), now: self.now()) }
            }
        case .latchLoginRequired(let reason):
            store.latchLoginRequired(machine.tokens, reason: reason)
        case .recordInFlight(let record):
            recordInFlight(record)
        case .removeInFlightRecord:
            do {
                try store.removeInFlightRecord()
            } catch {
                // Harmless beyond this line: a leftover record names a refresh token no longer in service
                // (stale, removed later), or holds a restart off for refresh_seconds.
                logger.warning("could not remove the in-flight refresh marker", metadata: ["error": "\(error)"])
            }
        case .release(let outcome):
            onOutcome?(outcome)
            let waiting = completions
            completions = []
            waiting.forEach { $0(outcome) }
        case .redact(let values):
            redactor.update(values)
        case .count(let metric):
            count(metric)
        case .log(let level, let message, let metadata):
            logger.log(level: Self.loggerLevel(level), "\(message)", metadata: metadata.mapValues { .string($0) })
        case .publish:
            publish()
            writeCacheIfChanged()
        case .tokenEndpointIdle:
            onTokenEndpointIdle?()
        }
    }

    /// The store answers on the loop (a file is written off it).
    private func write(_ tokens: TokenSet) {
        store.write(dpop?.keepingItsKey(in: tokens) ?? tokens) { [weak self] outcome in
            guard let self else { return }
            switch outcome {
            case .written:
                self.execute(self.machine.persisted(now: self.now()))
            case .failed(let error):
                self.execute(self.machine.persistFailed(error, now: self.now()))
            case .conflict(let read):
                self.metrics.storeConflicts.increment()
                self.deliver(read, source: "conflict") { self.machine.persistConflicted(read, now: self.now()) }
                // Adopted or not, the next write is based on the version just read: one that lost to an
                // older token set (ours are the live ones) then writes over it.
                self.store.noteAdopted()
            }
        }
    }

    /// Off the loop (fsync), like a token file write; the refresh token leaves only once it is on disk.
    private func recordInFlight(_ record: RefreshInFlightRecord) {
        let writer: @Sendable () throws -> Void
        do {
            writer = try store.inFlightRecordWriter(for: record)
        } catch {
            return execute(machine.inFlightRecordFailed("\(error)", now: self.now()))
        }
        OffLoopWork.run(on: loop, { Result { try writer() } }) { [weak self] outcome in
            guard let self else { return }
            switch outcome {
            case .success: self.execute(self.machine.inFlightRecorded(now: self.now()))
            case .failure(let error): self.execute(self.machine.inFlightRecordFailed("\(error)", now: self.now()))
            }
        }
    }

    /// Feeds the machine a read of the store; if it adopted what it read, the store learns that the
    /// tokens in service now come from that version.
    private func deliver(_ read: RefreshMachine.StoreRead, source: String, _ event: () -> [RefreshMachine.Action]) {
        let before = machine.generation
        let actions = event()
        if machine.generation != before, case .tokens(let adopted) = read {
            store.noteAdopted()
            lastAdoption = (Date(), source)
            metrics.countStoreAdoption(source: source)
            // Before the actions run: the requests the adoption releases are signed with the key the tokens are bound to.
            if let line = dpop?.adoptKey(arrivingWith: adopted) { logger.info("\(line)") }
        }
        execute(actions)
    }

    /// Picks up tokens written by someone else (an operator seeding tokens after "login required",
    /// `tokenrelay token import`, another process's rotation). A file store not during a cycle: its own
    /// write must not look like someone else's, and it re-reads the store under the lock anyway. A
    /// shared store at any time: a relay waiting for the lock adopts what the holder published.
    // Internal (was private): called from RefreshCoordinator.swift.
    func watchStore() {
        guard machine.state != .refreshing || store.isShared, store.changeSinceLastLook() else { return }
        readChangedStore(source: "poll")
    }

    // Internal (was private): called from RefreshCoordinator.swift.
    func storeAnnouncedChange() {
        readChangedStore(source: (store as? RedisTokenStore)?.isSubscribed == true ? "publish" : "poll")
    }

    private func readChangedStore(source: String) {
        store.read { [weak self] read in
            guard let self else { return }
            self.deliver(read, source: source) { self.machine.storeRead(read, inFlight: self.store.readInFlightRecord(), now: self.now()) }
        }
    }


    private func count(_ metric: RefreshMachine.Metric) {
        switch metric {
        case .cycleStarted(let trigger): metrics.countRefreshStarted(trigger: trigger.rawValue)
        case .refreshOutcome(let outcome): metrics.countRefresh(outcome: outcome)
        case .refreshError(let code): metrics.countRefreshError(code: code)
        case .refreshDuration(let seconds): metrics.refreshDuration.record(seconds)
        case .adoptedRotation: metrics.adoptedRotations.increment()
        case .stormGuardTrip: metrics.stormGuardTrips.increment()
        case .tokenFileWriteFailure: metrics.tokenFileWriteFailures.increment()
        case .storeConflict: break  // counted where the store answered
        }
    }

    private static func loggerLevel(_ level: RefreshMachine.LogLevel) -> Logger.Level {
        switch level {
        case .debug: return .debug
        case .info: return .info
        case .warning: return .warning
        case .error: return .error
        case .critical: return .critical
        }
    }

    // Internal (was private): called from RefreshCoordinator.swift.
    func publish() {
        metrics.tokenGeneration.record(Double(machine.generation))
        metrics.loginRequired.record(machine.state == .loginRequired ? 1 : 0)
        metrics.unsavedTokens.record(machine.hasUnsavedTokens ? 1 : 0)
        metrics.accessTokenExpiresAt.record(machine.tokens.expiresAt?.timeIntervalSince1970 ?? 0)
        metrics.secondsUntilExpiry.record(machine.tokens.expiresAt.map { max(0, $0.timeIntervalSinceNow) } ?? -1)
    }
}

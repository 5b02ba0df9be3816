import FoundationEssentials

/// The refresh lock `<key>:lock`: `SET NX PX` with our owner id, retried while contended, released by
/// compare-and-delete. Apart from the store's connections because it is its own small protocol.
extension RedisTokenStore {
    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void) {
        guard isConnected else { return deferred { completion(false, false) } }
        acquisition = Acquisition(deadline: EventLoop.monotonicNow + timeout, waited: false, completion: completion)
        tryLock()
    }

    private func tryLock() {
        guard let commands, acquisition != nil else { return }
        let sentAt = EventLoop.monotonicNow
        let milliseconds = String(Int((lockSeconds * 1000).rounded()))
        commands.send(["SET", lockKey, ownerID, "NX", "PX", milliseconds]) { [weak self] result in
            guard let self, var pending = self.acquisition else {
                // Given up meanwhile (adopted another relay's tokens): let go of a lock we just got.
                if case .success(.status) = result { self?.deleteOwnLock() }
                return
            }
            switch result {
            case .success(.status):
                self.acquisition = nil
                self.holdsLock = true
                self.lockHolder = self.ownerID
                self.lockValidUntil = sentAt + self.lockSeconds
                pending.completion(true, pending.waited)
            case .success(.null) where self.lockMayLinger:
                // Held, maybe by us: a lock of an earlier connection (a `SET` whose reply was lost, or one
                // held when the connection went). No cycle of ours runs now, so it is stale: deleted if it
                // is ours (compare-and-delete), then asked for again. Without this the cycle would wait out
                // the lock's whole lifetime on our own lock.
                self.lockMayLinger = false
                self.deleteOwnLock()
                self.tryLock()
            case .success(.null):
                guard EventLoop.monotonicNow + Self.lockRetryInterval < pending.deadline else {
                    self.acquisition = nil
                    return pending.completion(false, true)
                }
                pending.waited = true
                let retry = LoopEvent(loop: self.loop) { [weak self] _ in self?.tryLock() }
                retry.schedule(after: Self.lockRetryInterval)
                pending.retry = retry
                self.acquisition = pending
            case .success(let reply) where self.noticedReadOnly(reply):
                break  // `lost` has answered the acquisition
            case .success, .failure:
                // An error reply, or the connection failed (`lost` has answered already if so). Without a
                // reply, Redis may still run the `SET` (a stalled server resumes): the lock may be ours.
                if case .failure = result { self.lockMayLinger = true }
                self.acquisition = nil
                pending.completion(false, pending.waited)
            }
        }
    }

    /// The next `SET` uses it, a retry of a contended acquisition included. A lock we hold keeps its
    /// `lockValidUntil`: its expiry in Redis was set when it was taken, and the refresh machine checks
    /// that life against the exchange it is about to start.
    func useLockLifetime(_ seconds: Double) {
        lockSeconds = seconds
    }

    func release() {
        acquisition = nil
        guard holdsLock || lockMayLinger else { return }
        holdsLock = false
        lockValidUntil = nil
        guard isConnected else { return }
        lockMayLinger = false
        deleteOwnLock()
    }

    private func deleteOwnLock() {
        commands?.send(RedisScripts.releaseArguments(lockKey: lockKey, owner: ownerID)) { _ in }
        if lockHolder == ownerID { lockHolder = nil }
    }
}

import FoundationEssentials

/// Watching the version: the `<key>:updates` subscription and the poll that carries it while it is down.
/// Apart from the connections because it only turns announcements into `onChange`; reading and adopting
/// is `RedisTokenStore+Read.swift`.
extension RedisTokenStore {
    func subscribe() {  // internal (was private): confirmMaster in RedisTokenStore.swift starts it
        let connection = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: settings.commandTimeoutSeconds)
        subscriber = connection
        connection.onPush = { [weak self] message in
            guard let self, case .array(let parts) = message, parts.count == 3, parts[0].text == "message",
                  let version = parts[2].integer else { return }
            self.announced(version)
        }
        connection.onClosed = { [weak self, weak connection] _ in
            guard let self, let connection, self.subscriber === connection else { return }
            self.subscriptionDropped()
        }
        connection.open { _ in }
        connection.send(["SUBSCRIBE", channel]) { [weak self, weak connection] result in
            guard let self, let connection, self.subscriber === connection else { return }
            guard case .success(.array) = result else { return self.subscriptionDropped() }
            self.isSubscribed = true
            // Anything published while we were not subscribed is lost: look once.
            self.pollVersion()
        }
        startPolling()
    }

    /// The subscription failed: polling (always on) carries the announcements until it is back, and it
    /// is tried again meanwhile.
    private func subscriptionDropped() {
        subscriber?.close()
        subscriber = nil
        isSubscribed = false
        guard isConnected else { return }
        startPolling()
        let timer = LoopEvent(loop: loop) { [weak self] _ in
            guard let self, self.isConnected, self.subscriber == nil else { return }
            self.subscribe()
        }
        timer.schedule(after: 1)
        reconnectTimer = timer
    }

    /// The version is polled every `poll_interval_seconds` while connected, subscribed or not: it carries
    /// the announcements while the subscription is down, catches a message lost in a reconnect, and makes
    /// a Redis that went silent without closing the connection (a network partition) show up as
    /// unreachable within a command timeout instead of at the next refresh.
    private func startPolling() {
        guard pollTimer == nil else { return }
        let timer = LoopEvent.repeating(loop: loop) { [weak self] in self?.pollVersion() }
        timer.schedule(after: settings.pollIntervalSeconds)
        pollTimer = timer
    }

    private func pollVersion() {
        // The role rides along: a master demoted under us (the old master rejoining after a failover, an
        // operator's REPLICAOF) shows up within a poll, not at the next write.
        commands?.send(["ROLE"]) { [weak self] result in
            guard let self, case .success(let reply) = result, case .notMaster(let role) = RedisRole.parse(reply) else { return }
            self.notWritable("the node is a \(role) now, not the master (ROLE); writes cannot land there")
        }
        commands?.send(["HGET", settings.key, "version"]) { [weak self] result in
            guard let self, case .success(let reply) = result, let version = reply.integer else { return }
            self.announced(version)
        }
    }

    private func announced(_ version: Int64) {
        // Lower than ours: a read decides (`decode`) whether it is a lost write or an operator's new import.
        if let held, version < held.version {
            onChange?()
            return
        }
        announcedVersion = max(announcedVersion, version)
        if changeSinceLastLook() { onChange?() }
    }
}

import FoundationEssentials

/// The write path: the compare-and-set on the version, the `WAIT` for replicas, and the one write at
/// exit. Apart because each write must be acknowledged before it counts (persist before release).
extension RedisTokenStore {
    func write(_ tokens: TokenSet, completion: @escaping (TokenStoreWrite) -> Void) {
        compareAndSet(tokens, loginRequired: nil, completion: completion)
    }

    func latchLoginRequired(_ tokens: TokenSet, reason: String) {
        compareAndSet(tokens, loginRequired: reason) { _ in }
    }

    /// Persist before release: answers `written` only once Redis acknowledged the script.
    private func compareAndSet(_ tokens: TokenSet, loginRequired: String?, completion: @escaping (TokenStoreWrite) -> Void) {
        guard let commands, isConnected else { return deferred { completion(.failed(self.outage ?? "Redis is not connected")) } }
        let data: Data
        do {
            data = try codec.encode(tokens, expiryMilliseconds: true)
        } catch {
            return deferred { completion(.failed("\(error)")) }
        }
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: baseVersion, tokens: data,
                                                            loginRequired: loginRequired ?? "", writer: ownerID, dpopKeyField: dpopKeyField)
        commands.send(arguments) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error): completion(.failed(error.description))
            case .success(let reply):
                if self.noticedReadOnly(reply) { return completion(.failed(self.outage ?? "READONLY")) }
                switch RedisScripts.compareAndSetOutcome(reply) {
                case .written(let version):
                    self.noteDPoPKey(reply)
                    self.held = RedisHeldSet(version: version, value: data, loginRequired: loginRequired ?? "",
                                             importStamp: self.lastRead?.importStamp ?? self.held?.importStamp)
                    self.dataLossNoticedAt = nil
                    self.baseVersion = version
                    self.lastReadVersion = version
                    self.announcedVersion = max(self.announcedVersion, version)
                    self.awaitReplicas(completion)
                case .conflict:
                    self.read { completion(.conflict($0)) }
                case .failed(let reason):
                    completion(.failed(reason))
                }
            }
        }
    }

    /// `WAIT` narrows what a failover can lose: the new version is on `wait_replicas` replicas before the
    /// write counts as done. Too few in time is a failed write (the tokens stay in service and the write is
    /// retried, as for any failed write).
    private func awaitReplicas(_ completion: @escaping (TokenStoreWrite) -> Void) {
        let wanted = settings.waitReplicas
        guard wanted > 0, let commands else { return completion(.written) }
        let milliseconds = max(1, Int(settings.commandTimeoutSeconds * 500))
        commands.send(["WAIT", String(wanted), String(milliseconds)]) { result in
            switch result {
            case .success(.integer(let count)) where count >= wanted: completion(.written)
            case .success(.integer(let count)):
                completion(.failed("only \(count) of \(wanted) Redis replicas acknowledged the new token set within \(milliseconds) ms"))
            case .success(let other): completion(.failed("WAIT: unexpected reply \(other.text ?? "")"))
            case .failure(let error): completion(.failed(error.description))
            }
        }
    }

    /// At exit the loop has stopped: a short loop of our own carries one compare-and-set.
    func writeAtExit(_ tokens: TokenSet) throws {
        let data = try codec.encode(tokens, expiryMilliseconds: true)
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: baseVersion, tokens: data,
                                                            loginRequired: "", writer: ownerID, dpopKeyField: dpopKeyField)
        let reply = try RedisOneShot.run(endpoint: endpoint, timeout: settings.commandTimeoutSeconds * 2, arguments)
        switch RedisScripts.compareAndSetOutcome(reply) {
        case .written: return
        case .conflict: throw RedisStoreError(description: "Redis key \(settings.key) holds a newer version; ours was not written")
        case .failed(let reason): throw RedisStoreError(description: reason)
        }
    }

    /// A write that found `dpop_key` gone and stored this relay's key again: said once per time it happens.
    func noteDPoPKey(_ reply: RedisReply) {
        if RedisScripts.storedDPoPKey(reply) { onDPoPKeyStored?() }
    }
}

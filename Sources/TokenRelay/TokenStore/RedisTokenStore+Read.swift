import FoundationEssentials

/// Reading the token set and the put-back of a lost write (`RedisHeldSet`): what a read decides about the
/// version Redis holds (adopt, put ours back, follow an import, wait out a data loss). Apart from the
/// write path because these rules are about what is found, not about what is written.
extension RedisTokenStore {
    // MARK: - TokenStore: reading

    func changeSinceLastLook() -> Bool {
        announcedVersion > max(baseVersion, lastReadVersion)
    }

    func read(completion: @escaping (RefreshMachine.StoreRead) -> Void) {
        guard let commands, isConnected else { return deferred { completion(.unreadable(self.outage ?? "Redis is not connected")) } }
        commands.send(["GET", lockKey]) { [weak self] result in
            if case .success(let reply) = result { self?.lockHolder = reply.text }
        }
        readInFlight(commands)
        commands.send(["HMGET", settings.key, "version", "tokens", "login_required", "imported_at"]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error): completion(.unreadable(error.description))
            case .success(let reply): completion(self.decode(reply))
            }
        }
    }

    private func decode(_ reply: RedisReply) -> RefreshMachine.StoreRead {
        guard case .array(let fields) = reply, fields.count == 4 else {
            if case .error(let message) = reply { return .unreadable("Redis: \(message)") }
            return .unreadable("unexpected reply from Redis")
        }
        guard let version = fields[0].integer else { return emptyStore() }
        switch held?.verdict(storedVersion: version, storedImportStamp: fields[3].integer) {
        case .putBack?:
            putBack(over: version)
            return .unreadable("Redis key \(settings.key) holds version \(version), lower than version \(held?.version ?? 0) this relay "
                + "wrote or adopted (a write lost in a failover); writing the newer token set back before anyone refreshes")
        case .newerImport?:
            onImportFollowed?("Redis key \(settings.key) holds version \(version) from an import newer than version \(held?.version ?? 0) this "
                + "relay held (a flush, then an import); adopting it instead of putting ours back")
            held = nil
            announcedVersion = version
        case .current?, nil:
            // A latched set is not put back: Redis's lower version is followed from here on.
            if let held, version < held.version {
                self.held = nil
                announcedVersion = version
            }
        }
        dataLossNoticedAt = nil
        lastReadVersion = version
        announcedVersion = max(announcedVersion, version)
        guard case .string(let data) = fields[1] else { return .unreadable("Redis key \(settings.key) has a version but no tokens") }
        lastRead = (data, fields[2].text ?? "", fields[3].integer)
        let tokens: TokenSet
        do {
            tokens = try codec.decode(data, name: "redis:\(settings.key)")
        } catch {
            return .unreadable("\(error)")
        }
        if let reason = fields[2].text, !reason.isEmpty { return .latched(tokens, reason: reason) }
        return .tokens(tokens)
    }

    /// Rule (the race it prevents: Redis restarts empty, or is flushed, while another relay's refresh is at
    /// the token server; the lock, the fleet's only record of that refresh, went with the data, so a relay
    /// that needs a token takes a fresh lock, finds nothing newer and presents the same refresh token, and a
    /// rotation server revokes the session): a relay that has seen a version and now finds none presents
    /// nothing until a lock taken before the loss would have expired, `lockSeconds` from noticing it. The
    /// refresher's write, which an absent key accepts, is adopted meanwhile. A store this relay never saw
    /// with data (a first start) is only new.
    private func emptyStore() -> RefreshMachine.StoreRead {
        guard max(baseVersion, lastReadVersion, announcedVersion) > 0 else { return .empty }
        let now = EventLoop.monotonicNow
        let noticed = dataLossNoticedAt ?? now
        dataLossNoticedAt = noticed
        let left = noticed + lockSeconds - now
        guard left > 0 else { return .empty }
        return .unreadable("Redis key \(settings.key) lost its data (a restarted or flushed Redis); a refresh begun before the loss "
            + "may still be in progress, so no refresh token is presented for \(cFormat("%.1f", left)) s")
    }

    func noteAdopted() {
        baseVersion = lastReadVersion
        if let lastRead, lastReadVersion >= (held?.version ?? 0) {
            held = RedisHeldSet(version: lastReadVersion, value: lastRead.value, loginRequired: lastRead.loginRequired, importStamp: lastRead.importStamp)
        }
    }

    /// Rule (the race it prevents: a failover promoted a replica that never received our last write, or
    /// one we adopted; the next relay to refresh would present the refresh token that write's rotation
    /// burnt, and a rotation server revokes the fleet's session): Redis holding a lower version than one
    /// this relay wrote or adopted gets that newer token set back, by the compare-and-set on the version it
    /// holds now. Until then reads answer unreadable, so nothing is presented or adopted. A latched set
    /// ("login required") is never put back, nor one over an operator's newer import (`RedisHeldSet`).
    private func putBack(over stored: Int64) {
        guard let held, !puttingBack, let commands, isConnected else { return }
        puttingBack = true
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: stored, tokens: held.value,
                                                            loginRequired: held.loginRequired, writer: ownerID, dpopKeyField: dpopKeyField)
        commands.send(arguments) { [weak self] result in
            guard let self else { return }
            self.puttingBack = false
            guard case .success(let reply) = result, !self.noticedReadOnly(reply),
                  case .written(let version) = RedisScripts.compareAndSetOutcome(reply) else { return }
            self.noteDPoPKey(reply)
            self.writesPutBack += 1
            self.onCount?(.writePutBack)
            self.onPutBack?("Redis held version \(stored), lower than version \(held.version) this relay had seen; wrote it back as version \(version)")
            self.baseVersion = version
            self.lastReadVersion = version
            self.announcedVersion = version
            self.held?.version = version
        }
    }

    var version: Int64 { baseVersion }

    /// The import stamp of the record the next write replaces (what its mark in the local cache names).
    var lineageImportStamp: Int64? { lastRead?.importStamp ?? held?.importStamp }

    /// A token set from the local cache that Redis never acknowledged (`UnacknowledgedWriteMark`): held as the
    /// version past the one its write expected, so that Redis answering with that version (or a lower one of
    /// the same lineage) gets it written back (`putBack`).
    func holdUnacknowledged(_ tokens: TokenSet, _ mark: UnacknowledgedWriteMark.Mark) throws {
        // Clamped: the mark is read from a file, and its largest version must not trap.
        held = RedisHeldSet(version: min(mark.overVersion, Int64.max - 1) + 1, value: try codec.encode(tokens, expiryMilliseconds: true),
                            loginRequired: "", importStamp: mark.importStamp)
    }
}

import FoundationEssentials
import Logging

/// Fleet mode's local cache of the token set: marked writes while Redis has not acknowledged, flushed one
/// at a time. Apart because it is a second store beside the machine's, with its own ordering.
extension RefreshCoordinator {
    /// Fleet mode: tokens on their way to Redis go to the local cache too, marked as not acknowledged
    /// (`UnacknowledgedWriteMark`); the unmarked write after Redis's acknowledgement replaces them.
    // Internal (was private): called from RefreshCoordinator+Execution.swift.
    func markInCache(_ tokens: TokenSet) {
        guard let cache, let redis = store as? RedisTokenStore else { return }
        cacheWrite.pending = UnacknowledgedWriteMark.marking(tokens, .init(overVersion: redis.version, importStamp: redis.lineageImportStamp))
        flushCache(cache)
    }

    /// Fleet mode: the last adopted tokens go to the local cache, one write at a time, newest last.
    // Internal (was private): called from RefreshCoordinator+Execution.swift.
    func writeCacheIfChanged() {
        guard let cache, store.isShared, machine.generation != cachedGeneration, !machine.tokens.accessToken.isEmpty else { return }
        cachedGeneration = machine.generation
        // Tokens taken into service before Redis acknowledged them (a drain that ended with the write still
        // failing) keep the mark. Race it prevents: an unmarked copy replacing the marked one, so that the next
        // start follows Redis's older version and presents the refresh token this rotation burnt.
        if machine.hasUnsavedTokens, let redis = store as? RedisTokenStore {
            cacheWrite.pending = UnacknowledgedWriteMark.marking(machine.tokens, .init(overVersion: redis.version, importStamp: redis.lineageImportStamp))
        } else {
            cacheWrite.pending = machine.tokens
        }
        flushCache(cache)
    }

    private func flushCache(_ cache: TokenFile) {
        guard !cacheWrite.inFlight, let tokens = cacheWrite.pending else { return }
        cacheWrite = (true, nil)
        let path = cache.path
        let data = try? cache.encode(tokens)
        OffLoopWork.run(on: loop, { Result { try data.map { try TokenFile.write($0, to: path) } } }) { [weak self] outcome in
            guard let self else { return }
            self.cacheWrite.inFlight = false
            if case .failure(let error) = outcome { self.logger.warning("could not write the local token cache", metadata: ["error": "\(error)"]) }
            self.flushCache(cache)
        }
    }
}

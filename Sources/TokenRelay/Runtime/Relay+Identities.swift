/// A reload's `identities`: added ones start, removed ones stop (their held requests answered 503), and
/// those that stay keep their token store, machine and any refresh in flight, taking the new refresh
/// settings (`NamedIdentity.apply`). Applied before the routes, which look their identity up.
extension Relay {
    /// The identities the reload adds, made (token store opened) but not yet started or used.
    func makeAddedIdentities(_ identities: [NamedPreflight]) throws -> [NamedIdentity] {
        let running = Set(namedIdentities.map(\.name))
        return try identities.filter { !running.contains($0.name) }.map { named in
            do {
                return try NamedIdentity(named, loop: loop, metrics: metrics, redactor: redactor, logger: logger)
            } catch let error as ConfigError {
                throw error.underIdentity(named.name)
            }
        }
    }

    func applyIdentities(_ identities: [NamedPreflight], added: [NamedIdentity]) {
        var next: [NamedIdentity] = []
        for named in identities {
            if let running = namedIdentities.first(where: { $0.name == named.name }) {
                running.apply(named)
                next.append(running)
            } else if let new = added.first(where: { $0.name == named.name }) {
                new.start()
                next.append(new)
                logger.info("identity added by a config reload", metadata: ["identity": "\(new.name)"])
            }
        }
        let kept = Set(next.map(\.name))
        for removed in namedIdentities where !kept.contains(removed.name) {
            logger.info("identity removed by a config reload; its held requests are answered 503", metadata: ["identity": "\(removed.name)"])
            // Kept to the end of the process, stopped: a refresh in flight must still reach its token store
            // (its answer may hold the only copy of a rotated refresh token), and the exit still saves what
            // could not be saved.
            removed.retire()
            retiredIdentities.append(removed)
        }
        proxy.use(next)
        admin?.use(next)
        namedIdentities = next
    }
}

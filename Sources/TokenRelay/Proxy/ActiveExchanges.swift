/// Exchanges and tunnels in flight, in no order; each knows its slot (`activeSlot`), so that removing
/// one is a swap with the last, without hashing. A value with mutating methods: each insert or removal
/// is one access to the proxy's stored property.
struct ActiveExchanges {
    private(set) var all: [any ProxiedExchange] = []

    var count: Int { all.count }
    var isEmpty: Bool { all.isEmpty }

    mutating func insert(_ exchange: any ProxiedExchange) {
        exchange.activeSlot = all.count
        all.append(exchange)
    }

    /// No-op for one that is not in the list (or no longer).
    mutating func remove(_ exchange: any ProxiedExchange) {
        let slot = exchange.activeSlot
        guard all.indices.contains(slot), all[slot] === exchange else { return }
        let last = all.removeLast()
        if slot < all.count {
            last.activeSlot = slot
            all[slot] = last
        }
        exchange.activeSlot = -1
    }
}

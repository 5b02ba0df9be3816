/// How tickets and the connections a pool opened reach it (a ticket given up, a connection closed, bytes
/// nobody asked for), also after the pool is gone. Not a weak reference to the pool: that would give the
/// pool a side table, and every retain and release of it (several per request) would take the runtime's
/// slow path. The link is held strongly by whoever may report; the pool's deinit cuts it, so `pool` is
/// never a freed object (and safe `unowned` would trap, not read freed memory, were that rule broken).
final class PoolLink {
    unowned var pool: UpstreamPool?
}

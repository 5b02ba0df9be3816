/// One limit on the upstream connections of every pool that draws from it: the HTTP/1.1 and HTTP/2 pools
/// of every route, and those a reload retired until their last connection is back. However many routes
/// a process serves, it opens at most `limit` upstream connections in all. Loop thread only: every take
/// and give-back runs there, so a count and a line of pools are all it needs (no lock).
///
/// A pool takes a slot for each connection it opens (one still connecting holds a descriptor too) and
/// gives it back when the connection closes or leaves for a tunnel. A pool whose own bound would allow
/// another connection but finds the budget spent queues here, first come first served; each pool is in
/// the line at most once, so the line is bounded by the number of pools (their requests wait in the
/// pools' own bounded queues, under their own wait limit). A slot that frees is offered to the pool
/// first in line, which opens a connection for its first waiter and, if more of its requests wait,
/// queues again behind the others: routes take turns, slot by slot.
///
/// Two rules keep one pool's connections from starving another pool's requests while the budget is spent:
/// - Idle: a pool that joins the line closes the connection idle the longest in any other pool
///   (`reclaimIdle`). Without it, a route that was busy a moment ago keeps its keep-alive connections
///   for up to `idleTimeout` (or for ever, when that is 0), and a second route's requests wait their whole
///   pool wait and are answered 503 while nothing is being sent at all.
/// - Busy: a pool that gets a reusable connection back while another pool is first in line closes it
///   instead of reusing it (`isWaitedFor`), and a pool served from a reused connection while others wait
///   goes to the back (`servedInLine`). Without it, a route with a steady backlog hands each connection
///   from one of its requests to the next, and the other route waits until its requests time out.
/// A lower limit (a reload) is reached as connections close: none in use is cut for it.
public final class UpstreamConnectionBudget {
    /// A reload may change it: a higher limit is offered to the pools in line at once.
    public var limit: Int {
        didSet { offerFreeSlots() }
    }
    /// Connections open under the budget, in every pool.
    public private(set) var inUse = 0
    /// Pools in line for a slot (each at most once).
    public var waitingPools: Int { line.count - lineStart }

    private var members: [UpstreamBudgetSeat] = []
    private var line: [UpstreamBudgetSeat] = []
    private var lineStart = 0
    /// Set while slots are being offered: a slot given back meanwhile is offered by the loop under way.
    private var offering = false

    public init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// The budget of a pool that shares none: no bound beyond the pool's own.
    static func unbounded() -> UpstreamConnectionBudget { UpstreamConnectionBudget(limit: .max) }

    // MARK: - For the pools

    func join(_ seat: UpstreamBudgetSeat) {
        members.append(seat)
    }

    /// A pool going away: out of the members and out of the line (the offer loop skips a seat without a member).
    func leave(_ seat: UpstreamBudgetSeat) {
        seat.member = nil
        members.removeAll { $0 === seat }
    }

    /// Pools wait for a slot: connections given back should go to them (the cold path of a release).
    var hasWaitingPools: Bool { lineStart < line.count }

    /// Takes a slot for a pool that queues behind nobody: one is free and no pool is in line (a pool in
    /// line was there first).
    func take() -> Bool {
        guard inUse < limit, lineStart == line.count else { return false }
        inUse += 1
        return true
    }

    /// Takes the slot just offered (`UpstreamBudgetMember.budgetOffersSlot`).
    func takeOffered() {
        inUse += 1
    }

    /// A connection closed (or a slot taken for a connection that could not be opened): the slot goes to
    /// the pool first in line.
    func giveBack() {
        inUse -= 1
        offerFreeSlots()
    }

    /// Puts the pool at the back of the line (unless it is in line already) and, the budget being spent,
    /// closes the connection idle the longest in another pool to make room: its slot then goes to the
    /// first in line. A pool served from the line joins again if more of its requests wait, so each slot
    /// it gets reclaims the next idle connection.
    func wait(_ seat: UpstreamBudgetSeat) {
        guard !seat.isInLine else { return }
        seat.isInLine = true
        line.append(seat)
        if inUse >= limit { reclaimIdle(for: seat) } else { offerFreeSlots() }
    }

    /// The pool's last waiting request left (gave up, timed out): it leaves the line, where it would
    /// otherwise make other pools close connections for a slot it no longer wants.
    func leaveLine(_ seat: UpstreamBudgetSeat) {
        guard seat.isInLine else { return }
        seat.isInLine = false
        line.removeSubrange(..<lineStart)
        lineStart = 0
        line.removeAll { $0 === seat }
    }

    /// Another pool is first in line: a connection this pool no longer needs should close, for its slot.
    func isWaitedFor(by seat: UpstreamBudgetSeat) -> Bool {
        lineStart < line.count && line[lineStart] !== seat
    }

    /// The pool first in line was served without a slot (a connection of its own came back): it goes to
    /// the back, so the others get the next slots.
    func servedInLine(_ seat: UpstreamBudgetSeat) {
        guard line.count - lineStart > 1, line[lineStart] === seat else { return }
        lineStart += 1
        line.append(seat)
        compactLine()
    }

    // MARK: -

    private func offerFreeSlots() {
        guard !offering else { return }
        offering = true
        defer { offering = false }
        while inUse < limit, lineStart < line.count {
            let seat = line[lineStart]
            lineStart += 1
            seat.isInLine = false
            compactLine()
            // The member takes the slot (`takeOffered`) if it has a waiter left, and queues again if more wait.
            seat.member?.budgetOffersSlot()
        }
    }

    /// Closes the idle connection that has waited longest in a pool other than `seat`'s; its close gives
    /// its slot back, which offers it to the pool first in line.
    private func reclaimIdle(for seat: UpstreamBudgetSeat) {
        var oldest: (member: any UpstreamBudgetMember, since: Double)?
        for other in members where other !== seat {
            guard let member = other.member, let since = member.oldestIdleSince else { continue }
            if oldest.map({ since < $0.since }) ?? true { oldest = (member, since) }
        }
        oldest?.member.closeOldestIdle()
    }

    private func compactLine() {
        if lineStart == line.count {
            line.removeAll(keepingCapacity: true)
            lineStart = 0
        } else if lineStart > 32 && lineStart * 2 > line.count {
            line.removeFirst(lineStart)
            lineStart = 0
        }
    }
}

/// What the budget asks of a pool.
protocol UpstreamBudgetMember: AnyObject {
    /// The pool was first in line and a slot is free: if a request still waits for a new connection, the
    /// pool takes it (`takeOffered`) and opens one, and queues again (`wait`) if more requests wait.
    func budgetOffersSlot()
    /// When the connection idle the longest in this pool went idle (monotonic seconds); nil: none idle.
    var oldestIdleSince: Double? { get }
    /// Closes that connection; its close gives its slot back.
    func closeOldestIdle()
}

/// A pool's place in a budget: its membership, and whether it is in line. Unowned: the pool's deinit
/// leaves the budget, so `member` never outlives it; and a weak reference would give every pool a side
/// table, which slows each retain and release of it (several per request).
final class UpstreamBudgetSeat {
    unowned var member: (any UpstreamBudgetMember)?
    var isInLine = false

    init() {}
}

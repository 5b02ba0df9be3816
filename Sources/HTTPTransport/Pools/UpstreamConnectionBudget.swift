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
///
/// Half the limit is reserved, shared out between the routes (`UpstreamBudgetAccount`, one per route: its
/// HTTP/1.1 and HTTP/2 pools draw on it together): each route's reserve is limit / (2 × routes), rounded
/// down (0 when there are more than limit / 2 routes). A pool takes a slot while its route is below its
/// reserve, or when the free slots exceed what the other routes' reserves still lack. Without it, one
/// route whose upstream is slow holds every slot and another route's requests wait their pool wait and
/// get 503; with it, that route still gets all but the others' reserves (with one route, all of it).
public final class UpstreamConnectionBudget {
    /// A reload may change it: reserves follow, and a higher limit is offered to the pools in line at once.
    public var limit: Int {
        didSet {
            computeReserves()
            offerFreeSlots()
        }
    }
    /// Connections open under the budget, in every pool.
    public private(set) var inUse = 0
    /// Pools in line for a slot (each at most once).
    public var waitingPools: Int { line.count - lineStart }

    private var members: [UpstreamBudgetSeat] = []
    /// The routes that have a reserve: each with a pool that is not retired.
    private var accounts: [UpstreamBudgetAccount] = []
    private var line: [UpstreamBudgetSeat] = []
    private var lineStart = 0
    /// Set while slots are being offered: a slot given back meanwhile is offered by the loop under way.
    private var offering = false

    public init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// Slots reserved for each route now (the same for all).
    public var reservePerRoute: Int { accounts.first?.reserve ?? 0 }

    /// The budget of a pool that shares none: no bound beyond the pool's own.
    static func unbounded() -> UpstreamConnectionBudget { UpstreamConnectionBudget(limit: .max) }

    // MARK: - For the pools

    func join(_ seat: UpstreamBudgetSeat) {
        members.append(seat)
        let account = seat.account
        account.members += 1
        if account.members == 1 && !account.isRetired {
            accounts.append(account)
            computeReserves()
        }
    }

    /// A pool going away: out of the members and out of the line (the offer loop skips a seat without a member).
    func leave(_ seat: UpstreamBudgetSeat) {
        seat.member = nil
        members.removeAll { $0 === seat }
        seat.account.members -= 1
        if seat.account.members == 0 { dropReserve(of: seat.account) }
    }

    /// A route a reload replaced (or one no request can reach): it keeps the slots it uses but reserves
    /// none, and the others' reserves grow. Its connections in use are not cut.
    public func retire(_ account: UpstreamBudgetAccount) {
        account.isRetired = true
        dropReserve(of: account)
    }

    /// Pools wait for a slot: connections given back should go to them (the cold path of a release).
    var hasWaitingPools: Bool { lineStart < line.count }

    /// Takes a slot for a pool that queues behind nobody: one is free and no pool is in line (a pool in
    /// line was there first).
    /// A route below its reserve passes the line: those in line are over their share and wait for slots
    /// beyond the reserves.
    func take(_ seat: UpstreamBudgetSeat) -> Bool {
        let account = seat.account
        guard inUse < limit else { return false }
        if account.inUse >= account.reserve {
            guard lineStart == line.count, mayTakeBeyondReserve(account) else { return false }
        }
        inUse += 1
        account.inUse += 1
        return true
    }

    /// Takes the slot just offered (`UpstreamBudgetMember.budgetOffersSlot`).
    func takeOffered(_ seat: UpstreamBudgetSeat) {
        inUse += 1
        seat.account.inUse += 1
    }

    /// A connection closed (or a slot taken for a connection that could not be opened): the slot goes to
    /// the pool first in line that may take it.
    func giveBack(_ account: UpstreamBudgetAccount) {
        inUse -= 1
        account.inUse -= 1
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
        if mayTake(seat.account) { offerFreeSlots() } else { reclaimIdle(for: seat) }
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
    /// So is a route below its reserve further back, which is served before this one (`nextServed`). A
    /// route within its reserve keeps its connections: those slots are its own.
    func isWaitedFor(by seat: UpstreamBudgetSeat) -> Bool {
        guard lineStart < line.count else { return false }
        let account = seat.account
        if account.reserve > 0 && account.inUse <= account.reserve { return false }
        if line[lineStart] !== seat { return true }
        return line[(lineStart + 1)...].contains { $0.account.inUse < $0.account.reserve }
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
        while inUse < limit, let seat = nextServed() {
            // The member takes the slot (`takeOffered`) if it has a waiter left, and queues again if more wait.
            seat.member?.budgetOffersSlot()
        }
    }

    /// Out of the line: the first pool whose route is below its reserve, otherwise the first that may take
    /// a slot beyond the reserves (nil: the free slots are the reserves of routes that do not wait now).
    private func nextServed() -> UpstreamBudgetSeat? {
        guard lineStart < line.count else { return nil }
        var chosen: Int?
        if accounts.count > 1 {
            chosen = (lineStart..<line.count).first { line[$0].account.inUse < line[$0].account.reserve }
            if chosen == nil { chosen = (lineStart..<line.count).first { mayTakeBeyondReserve(line[$0].account) } }
            guard chosen != nil else { return nil }
        }
        let index = chosen ?? lineStart
        let seat = line[index]
        seat.isInLine = false
        if index == lineStart { lineStart += 1 } else { line.remove(at: index) }
        compactLine()
        return seat
    }

    private func mayTake(_ account: UpstreamBudgetAccount) -> Bool {
        inUse < limit && (account.inUse < account.reserve || mayTakeBeyondReserve(account))
    }

    /// More slots are free than the other routes' reserves still lack: one may go beyond `account`'s reserve.
    private func mayTakeBeyondReserve(_ account: UpstreamBudgetAccount) -> Bool {
        guard accounts.count > 1 else { return inUse < limit }
        var lacking = 0
        for other in accounts where other !== account { lacking += max(0, other.reserve - other.inUse) }
        return limit - inUse > lacking
    }

    private func computeReserves() {
        // Half the limit, shared out; one route alone reserves nothing (it may take every slot anyway).
        let reserve = accounts.count > 1 ? limit / (2 * accounts.count) : 0
        for account in accounts { account.reserve = reserve }
    }

    private func dropReserve(of account: UpstreamBudgetAccount) {
        guard let index = accounts.firstIndex(where: { $0 === account }) else { return }
        accounts.remove(at: index)
        account.reserve = 0
        computeReserves()
        // Slots it reserved may now go to the pools in line.
        offerFreeSlots()
    }

    /// Closes the idle connection that has waited longest in a pool other than `seat`'s (of a route over its
    /// reserve); its close gives its slot back, which offers it to the pool first in line.
    private func reclaimIdle(for seat: UpstreamBudgetSeat) {
        var oldest: (member: any UpstreamBudgetMember, since: Double)?
        for other in members where other !== seat {
            // An idle connection within its route's reserve stays: closing it frees no slot anyone else may take.
            guard other.account.inUse > other.account.reserve else { continue }
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
    let account: UpstreamBudgetAccount

    init(account: UpstreamBudgetAccount?) {
        self.account = account ?? UpstreamBudgetAccount()
    }
}

/// A route's share of a budget: the slots its pools (HTTP/1.1 and HTTP/2) use, and the slots reserved for it.
/// A pool given none has one of its own.
public final class UpstreamBudgetAccount {
    /// Slots the route's pools hold, retired ones included (their connections count until they close).
    public fileprivate(set) var inUse = 0
    public fileprivate(set) var reserve = 0
    fileprivate var members = 0
    fileprivate var isRetired = false

    public init() {}
}

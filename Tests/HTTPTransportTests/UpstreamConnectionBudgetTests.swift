@testable import HTTPTransport
import XCTest

/// The shared upstream connection budget on its own, with stand-in pools: slots, the line of pools, turns,
/// reclaiming idle connections, limit changes. No loop, no socket: the budget is plain bookkeeping.
final class UpstreamConnectionBudgetTests: XCTestCase {
    /// A pool as the budget sees it: requests waiting for a new connection, connections open, idle ones.
    private final class StandInPool: UpstreamBudgetMember {
        let name: String
        let budget: UpstreamConnectionBudget
        let seat: UpstreamBudgetSeat
        var waiting = 0
        var open = 0
        /// When each idle connection went idle, oldest first.
        var idle: [Double] = []
        let log: Log

        init(_ name: String, _ budget: UpstreamConnectionBudget, log: Log, account: UpstreamBudgetAccount? = nil) {
            seat = UpstreamBudgetSeat(account: account)
            self.name = name
            self.budget = budget
            self.log = log
            seat.member = self
            budget.join(seat)
        }

        deinit { budget.leave(seat) }

        /// A request arrives: a connection opens if the budget allows, else it waits in line.
        func request() {
            if budget.take(seat) {
                open += 1
                log.events.append("\(name) opened")
            } else {
                waiting += 1
                budget.wait(seat)
            }
        }

        /// A connection of this pool closes.
        func close() {
            open -= 1
            budget.giveBack(seat.account)
        }

        func budgetOffersSlot() {
            guard waiting > 0 else { return }
            waiting -= 1
            budget.takeOffered(seat)
            open += 1
            log.events.append("\(name) opened")
            if waiting > 0 { budget.wait(seat) }
        }

        var oldestIdleSince: Double? { idle.first }

        func closeOldestIdle() {
            guard !idle.isEmpty else { return }
            idle.removeFirst()
            log.events.append("\(name) closed idle")
            close()
        }
    }

    private final class Log {
        var events: [String] = []
    }

    func testSlotsAreTakenUpToTheLimitAndGivenBack() {
        let budget = UpstreamConnectionBudget(limit: 2)
        let a = UpstreamBudgetSeat(account: nil), b = UpstreamBudgetSeat(account: nil)
        budget.join(a); budget.join(b)
        XCTAssertTrue(budget.take(a))
        XCTAssertTrue(budget.take(b))
        XCTAssertFalse(budget.take(a), "the limit is for every pool together")
        XCTAssertEqual(budget.inUse, 2)
        budget.giveBack(a.account)
        XCTAssertEqual(budget.inUse, 1)
        XCTAssertTrue(budget.take(b))
    }

    /// Two routes with a backlog each: slots go to the pools in line in turn, first come first served,
    /// and the count never exceeds the limit.
    func testPoolsInLineTakeTurns() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 2)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request(); a.request()
        a.request(); a.request()   // a waits (2)
        b.request(); b.request()   // b waits behind a (2)
        XCTAssertEqual(budget.waitingPools, 2)
        XCTAssertEqual(log.events, ["a opened", "a opened"])
        log.events = []
        for _ in 0..<4 {
            if a.open > 0 { a.close() } else { b.close() }
            XCTAssertLessThanOrEqual(budget.inUse, 2)
        }
        XCTAssertEqual(log.events, ["a opened", "b opened", "a opened", "b opened"])
        XCTAssertEqual(budget.waitingPools, 0)
        XCTAssertEqual(a.waiting + b.waiting, 0)
        XCTAssertEqual(budget.inUse, 2)
    }

    /// A slot freed by any pool wakes a pool waiting only for the budget.
    func testASlotFreedByOnePoolGoesToAnotherThatWaits() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 1)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request()
        b.request()
        XCTAssertEqual(b.waiting, 1)
        a.close()
        XCTAssertEqual(b.open, 1)
        XCTAssertEqual(b.waiting, 0)
        XCTAssertEqual(log.events, ["a opened", "b opened"])
        XCTAssertFalse(budget.take(a.seat))
    }

    /// A pool in line whose requests all left (gave up, timed out) takes no slot when offered one, and
    /// leaves the line.
    func testAPoolWithNobodyWaitingLeavesTheLine() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 1)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request()
        b.request()
        XCTAssertFalse(budget.take(a.seat), "a newcomer does not pass b")
        b.waiting = 0
        a.close()
        XCTAssertEqual(budget.inUse, 0)
        XCTAssertEqual(budget.waitingPools, 0)
        XCTAssertTrue(budget.take(a.seat), "the line is empty again")
    }

    /// The budget is spent by idle connections of one pool: a pool that starts waiting has the oldest
    /// idle one closed, and gets its slot at once; busy connections are never closed for it.
    func testIdleConnectionsOfAnotherPoolAreReclaimedOldestFirst() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 3)
        let a = StandInPool("a", budget, log: log), c = StandInPool("c", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request(); c.request(); c.request()
        a.idle = [20]
        c.idle = [10]      // c's other connection is busy
        log.events = []
        b.request()
        XCTAssertEqual(log.events, ["c closed idle", "b opened"], "the idle one that waited longest goes")
        b.request()
        XCTAssertEqual(log.events, ["c closed idle", "b opened", "a closed idle", "b opened"])
        b.request()
        XCTAssertEqual(b.waiting, 1, "nothing idle is left: the busy connections stay")
        XCTAssertEqual(c.open, 1)
        XCTAssertEqual(budget.inUse, 3)
    }

    /// A pool served from the line that still has waiters reclaims the next idle connection, so one
    /// request in line cannot leave idle connections standing while others wait.
    func testEachSlotServedReclaimsTheNextIdleConnection() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 2)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request(); a.request()
        log.events = []
        // Both of a's connections busy while b queues 2 requests (nothing idle to reclaim then); then a's
        // connections go idle, and the first closes by itself (its idle timeout).
        b.request(); b.request()
        XCTAssertEqual(b.waiting, 2)
        a.idle = [1, 2]
        a.idle.removeFirst()
        log.events.append("a closed idle")
        a.close()          // b is served and joins the line again, which reclaims a's other idle connection
        XCTAssertEqual(log.events, ["a closed idle", "b opened", "a closed idle", "b opened"])
        XCTAssertEqual(b.waiting, 0)
        XCTAssertEqual(a.open, 0)
    }

    /// `isWaitedFor` and `servedInLine`: the rules a pool applies to a connection it gets back.
    func testAPoolServedOutOfItsOwnConnectionsGoesToTheBack() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 1)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request()
        a.request()
        b.request()
        XCTAssertFalse(budget.isWaitedFor(by: a.seat), "a is first in line: it may reuse its connection")
        XCTAssertTrue(budget.isWaitedFor(by: b.seat))
        budget.servedInLine(a.seat)
        XCTAssertTrue(budget.isWaitedFor(by: a.seat), "after its turn, b is first: a's next connection back closes for b")
        a.close()
        XCTAssertEqual(b.open, 1)
        XCTAssertEqual(log.events.last, "b opened")
    }

    /// A reload raising the limit serves the pools in line at once; lowering it cuts nothing and is
    /// reached as connections close.
    func testLimitChangesApplyWithoutClosingConnectionsInUse() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 2)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        a.request(); a.request(); b.request()
        budget.limit = 3
        XCTAssertEqual(b.open, 1, "the waiting pool got the new slot")
        budget.limit = 1
        XCTAssertEqual(budget.inUse, 3, "nothing in use is closed")
        b.request()
        XCTAssertEqual(b.waiting, 1)
        a.close()
        XCTAssertEqual(b.waiting, 1, "still over the lowered limit")
        a.close()
        XCTAssertEqual(b.waiting, 1, "at the lowered limit")
        XCTAssertEqual(budget.inUse, 1)
        b.close()
        XCTAssertEqual(b.waiting, 0)
        XCTAssertEqual(b.open, 1)
        XCTAssertEqual(budget.inUse, 1)
    }

    /// A pool that went away while in line is skipped; its slot goes to the next.
    func testAPoolThatLeftIsSkipped() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 1)
        let a = StandInPool("a", budget, log: log), c = StandInPool("c", budget, log: log)
        var b: StandInPool? = StandInPool("b", budget, log: log)
        a.request()
        b!.request()
        c.request()
        b = nil
        a.close()
        XCTAssertEqual(c.open, 1)
        XCTAssertEqual(budget.inUse, 1)
    }

    // MARK: - Reserves

    /// limit / (2 × routes), rounded down; one route reserves nothing; a route's two pools are one route.
    func testEachRouteReservesItsPartOfHalfTheLimit() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log)
        XCTAssertEqual(budget.reservePerRoute, 0, "one route alone")
        let b = StandInPool("b", budget, log: log)
        XCTAssertEqual(budget.reservePerRoute, 2)
        XCTAssertEqual(a.seat.account.reserve, 2)
        let bOtherPool = StandInPool("b2", budget, log: log, account: b.seat.account)
        XCTAssertEqual(budget.reservePerRoute, 2, "b's HTTP/1.1 and HTTP/2 pools share b's account")
        let c = StandInPool("c", budget, log: log)
        XCTAssertEqual(budget.reservePerRoute, 1, "8 / 6")
        let d = StandInPool("d", budget, log: log), e = StandInPool("e", budget, log: log)
        XCTAssertEqual(budget.reservePerRoute, 0, "8 / 10: more routes than half the limit")
        budget.limit = 128
        XCTAssertEqual(budget.reservePerRoute, 12, "128 / 10")
        budget.retire(e.seat.account)
        XCTAssertEqual(budget.reservePerRoute, 16, "a retired route reserves nothing")
        XCTAssertEqual(e.seat.account.reserve, 0)
        withExtendedLifetime([d, c, bOtherPool]) {}
    }

    /// Two routes, limit 8: a's slow backlog gets 6 (all but b's reserve of 2), b is served at once, and
    /// b's third request (over its reserve, nothing free) waits like a's.
    func testARouteWithABacklogLeavesTheOtherRoutesReserve() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        for _ in 0..<10 { a.request() }
        XCTAssertEqual(a.open, 6)
        XCTAssertEqual(a.waiting, 4)
        b.request()
        XCTAssertEqual(b.open, 1, "below its reserve: it passes a in line")
        b.request()
        XCTAssertEqual(b.open, 2)
        b.request()
        XCTAssertEqual(b.waiting, 1)
        XCTAssertEqual(budget.inUse, 8)
        // A freed slot of a goes FIFO: a was first in line and b is at its reserve.
        log.events = []
        a.close()
        XCTAssertEqual(log.events, ["a opened"])
        b.close()
        XCTAssertEqual(log.events, ["a opened", "b opened"], "b back at its reserve: its own slot comes back to it")
        XCTAssertEqual(a.open, 6)
    }

    /// A slot freed goes to a waiter below its reserve although a waiter over its share is ahead of it;
    /// past the reserve, FIFO again. (a took all 8 while alone; b arrived later.)
    func testAWaiterBelowItsReserveIsServedFirst() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log)
        for _ in 0..<8 { a.request() }
        let b = StandInPool("b", budget, log: log)
        a.request()                 // a waits first
        b.request(); b.request()    // then b, below its reserve of 2, with 2 requests
        b.request()                 // and a third, which will be over its reserve
        XCTAssertEqual(budget.waitingPools, 2)
        log.events = []
        a.close()
        XCTAssertEqual(log.events, ["b opened"])
        a.close()
        XCTAssertEqual(log.events, ["b opened", "b opened"])
        a.close()
        XCTAssertEqual(log.events, ["b opened", "b opened", "a opened"], "b at its reserve: first come first served, a was first")
        XCTAssertEqual(b.waiting, 1)
    }

    /// Several slots free at once (a reload raising the limit to 12: reserves of 3): b, below its reserve,
    /// is served before a, which waited first and could take a slot beyond the reserves; then FIFO.
    func testARaisedLimitServesTheRouteBelowItsReserveFirst() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log)
        for _ in 0..<8 { a.request() }
        let b = StandInPool("b", budget, log: log)
        a.request(); a.request()
        b.request(); b.request()
        log.events = []
        budget.limit = 12
        XCTAssertEqual(log.events, ["b opened", "b opened", "a opened"], "a's second waiter would eat b's last reserved slot")
        XCTAssertEqual(a.waiting, 1)
        XCTAssertEqual(budget.inUse, 11)
    }

    /// A pool over its share first in line gets a connection back while a route below its reserve waits
    /// behind it: the connection closes for that route (its slot is served first) instead of being reused.
    func testAConnectionComesBackToARouteBelowItsReserveWaitingBehind() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log)
        for _ in 0..<9 { a.request() }   // 8 open while a was alone, one waiting
        let b = StandInPool("b", budget, log: log)
        b.request()
        XCTAssertEqual(b.waiting, 1, "nothing free: b waits behind a, below its reserve")
        XCTAssertFalse(budget.isWaitedFor(by: b.seat))
        XCTAssertTrue(budget.isWaitedFor(by: a.seat), "a is first in line, but b below its reserve is served first")
    }

    /// Idle connections a route holds within its reserve are not closed for a route that could not take
    /// the slot anyway (over its share): only idle connections over a reserve are reclaimed.
    func testIdleConnectionsWithinAReserveAreNotReclaimed() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        b.request(); b.request()
        b.idle = [1, 2]
        for _ in 0..<7 { a.request() }
        XCTAssertEqual(a.open, 6)
        XCTAssertEqual(a.waiting, 1)
        XCTAssertEqual(b.open, 2, "b's idle connections are its reserve")
        XCTAssertFalse(log.events.contains("b closed idle"))
    }

    /// A reload lowering the limit shrinks the reserves (8 → 4: 2 each → 1 each) and closes nothing: a route
    /// over the new numbers keeps its connections, and the limit is reached as they close.
    func testALowerLimitShrinksTheReservesWithoutClosingAnything() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        for _ in 0..<6 { a.request() }
        b.request(); b.request()
        budget.limit = 4
        XCTAssertEqual(budget.reservePerRoute, 1)
        XCTAssertEqual(budget.inUse, 8, "nothing in use is cut")
        b.close()
        b.request()
        XCTAssertEqual(b.waiting, 1, "b is at its new reserve and nothing is free")
        for _ in 0..<3 { a.close() }
        XCTAssertEqual(b.waiting, 1, "still at the lowered limit (a 3, b 1)")
        a.close()
        XCTAssertEqual(b.open, 2, "a slot under the limit, and a (2) lacks nothing: b takes it beyond its reserve")
        XCTAssertEqual(budget.inUse, 4)
    }

    /// A route retired by a reload reserves nothing: the route left alone may take every slot, and its
    /// pools in line are offered the slots the retired route no longer reserves.
    func testARetiredRoutesReserveGoesToTheOthers() {
        let log = Log()
        let budget = UpstreamConnectionBudget(limit: 8)
        let a = StandInPool("a", budget, log: log), b = StandInPool("b", budget, log: log)
        for _ in 0..<8 { a.request() }
        XCTAssertEqual(a.open, 6)
        budget.retire(b.seat.account)
        XCTAssertEqual(a.open, 8, "the 2 reserved slots went to a's waiters at once")
        XCTAssertEqual(budget.inUse, 8)
    }
}

/// Two real pools (two upstreams) sharing one budget: turns across pools when one has a backlog, and an
/// idle connection of one pool closed for the other's request.
final class SharedBudgetPoolTests: LoopThreadTestCase {
    private var serverA: TransportTestServer!
    private var serverB: TransportTestServer!

    override func setUpWithError() throws {
        try super.setUpWithError()
        serverA = try TransportTestServer()
        serverB = try TransportTestServer()
    }

    override func tearDown() {
        super.tearDown()
        serverA.stop()
        serverB.stop()
    }

    private func pools(limit: Int) -> (UpstreamPool, UpstreamPool, UpstreamConnectionBudget) {
        let loop = loopThread.loop
        let (portA, portB) = (serverA.port, serverB.port)
        return loopThread.sync {
            let budget = UpstreamConnectionBudget(limit: limit)
            return (UpstreamPool(loop: loop, host: "127.0.0.1", port: portA, budget: budget),
                    UpstreamPool(loop: loop, host: "127.0.0.1", port: portB, budget: budget), budget)
        }
    }

    /// Completes one request on `connection` so that it is reusable.
    private func use(_ connection: HTTPClientConnection) {
        let recorder = RecordingClient()
        loopThread.sync {
            connection.handler = recorder
            connection.startRequest(method: "GET", target: Array("/echo".utf8), fields: [("Host", "u")], body: .none)
            connection.finishRequest()
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
    }

    /// Pool a holds the only slot and has two more requests waiting; pool b's request queues after them.
    /// a's connection comes back twice: the first time a's own waiter reuses it (a was first in line), the
    /// second time it closes for b (b is first in line by then). Without the turns, b would wait for all
    /// of a's backlog.
    func testABacklogOnOnePoolDoesNotKeepTheOtherWaiting() throws {
        let (a, b, budget) = pools(limit: 1)
        let granted = ResultBox<[(String, HTTPClientConnection)]>()
        granted.value = []
        loopThread.sync {
            for name in ["a1", "a2", "a3"] {
                a.acquire(lane: .arriving) { if let c = try? $0.get() { granted.value!.append((name, c)) } }
            }
            b.acquire(lane: .arriving) { if let c = try? $0.get() { granted.value!.append(("b1", c)) } }
        }
        XCTAssertEqual(loopThread.sync { granted.value!.map(\.0) }, ["a1"])
        XCTAssertEqual(loopThread.sync { budget.waitingPools }, 2)
        for step in 1...3 {
            let (_, connection) = loopThread.sync { granted.value!.last! }
            use(connection)
            let owner: UpstreamPool = loopThread.sync { granted.value!.last!.0.hasPrefix("a") ? a : b }
            loopThread.sync { owner.release(connection) }
            let deadline = Date().addingTimeInterval(5)
            while loopThread.sync({ granted.value!.count }) <= step && Date() < deadline { usleep(2000) }
            XCTAssertLessThanOrEqual(loopThread.sync { a.openCount + b.openCount }, 1, "never over the shared limit")
        }
        XCTAssertEqual(loopThread.sync { granted.value!.map(\.0) }, ["a1", "a2", "b1", "a3"])
        loopThread.sync {
            a.release(granted.value!.last!.1)
            a.closeIdle()
            b.closeIdle()
        }
    }

    /// Pool a's two connections are idle; b's request has the older closed and is served at once.
    func testAnIdleConnectionOfAnotherPoolMakesRoom() throws {
        let (a, b, budget) = pools(limit: 2)
        let first: [HTTPClientConnection] = loopThread.sync {
            var taken: [HTTPClientConnection] = []
            for _ in 0..<2 { a.acquire(lane: .arriving) { if let c = try? $0.get() { taken.append(c) } } }
            return taken
        }
        XCTAssertEqual(first.count, 2)
        for connection in first { use(connection) }
        loopThread.sync { for connection in first { a.release(connection) } }
        XCTAssertEqual(loopThread.sync { (a.idleCount, budget.inUse) }.1, 2)
        let gotB = ResultBox<HTTPClientConnection>()
        let ticket = loopThread.sync { b.acquire(lane: .arriving) { gotB.value = try? $0.get() } }
        XCTAssertFalse(loopThread.sync { ticket.isWaiting }, "served before acquire returned")
        XCTAssertNotNil(loopThread.sync { gotB.value })
        XCTAssertEqual(loopThread.sync { a.openCount }, 1, "one of a's idle connections was closed for it")
        XCTAssertEqual(loopThread.sync { budget.inUse }, 2)
        // a's remaining idle connection is the newer one (the older went).
        XCTAssertEqual(loopThread.sync { a.takeIdleConnection() } === first[1], true)
        loopThread.sync {
            b.release(gotB.value!)
            a.release(first[1])
            a.closeIdle()
            b.closeIdle()
        }
    }
}

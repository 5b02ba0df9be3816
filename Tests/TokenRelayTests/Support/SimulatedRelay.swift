import Foundation
@testable import TokenRelay

/// One relay of a `SimulatedFleet`: a `RefreshMachine` and the driver `RefreshCoordinator` would be, with
/// `RedisTokenStore`'s bookkeeping (the version the tokens in service came from, the last version read,
/// announcements and polling), and a steady stream of requests.
final class SimulatedRelay {
    typealias Machine = RefreshMachine

    unowned let fleet: SimulatedFleet
    let index: Int
    private(set) var machine: Machine
    private var timers: [Machine.Timer: Int] = [:]
    private var timerSerial = 0
    private var baseVersion: Int64 = 0
    private var lastReadVersion: Int64 = 0
    private var announcedVersion: Int64 = 0
    private var lockWait: (deadline: Double, serial: Int)?
    private var lockSerial = 0
    private var holdsLock = false
    private var lockValidUntil: Double?
    private var held: [UInt64] = []
    private var queue: [Machine.Action] = []
    private var executing = false
    /// Killed: nothing it scheduled runs any more, and it sends nothing.
    private(set) var killed = false

    func kill() { killed = true }

    private func later(_ delay: Double, _ work: @escaping () -> Void) {
        fleet.after(delay) { [unowned self] in if !self.killed { work() } }
    }

    init(fleet: SimulatedFleet, index: Int) {
        self.fleet = fleet
        self.index = index
        var settings = Machine.Settings()
        settings.sharedStore = true
        settings.refreshTimeout = 2
        settings.storeWriteTimeout = 0.5
        settings.lockTimeout = 6
        let (read, version) = fleet.read()
        guard case .tokens(let stored) = read else { fatalError("the simulated store holds no tokens") }
        machine = Machine(tokens: stored, settings: settings, now: fleet.now())
        baseVersion = version
        lastReadVersion = version
    }

    func start() {
        execute(machine.start(now: fleet.now(), inFlight: fleet.inFlightRecord))
        poll()
        sendRequest()
    }

    // MARK: - Store bookkeeping (RedisTokenStore)

    func announced(_ version: Int64) {
        guard !killed else { return }
        announcedVersion = max(announcedVersion, version)
        if announcedVersion > max(baseVersion, lastReadVersion) { readStore { self.machine.storeRead($0, inFlight: $1, now: $2) } }
    }

    private func poll() {
        later(fleet.pollInterval) {
            self.later(self.fleet.redisLatency) { self.announced(self.fleet.version) }
            self.poll()
        }
    }

    private func readStore(_ event: @escaping (Machine.StoreRead, RefreshInFlightRead, Machine.Instant) -> [Machine.Action]) {
        later(fleet.redisLatency) {
            let (read, version) = self.fleet.read()
            self.lastReadVersion = version
            self.announcedVersion = max(self.announcedVersion, version)
            self.deliver(read, version) { event(read, self.fleet.inFlightRecord, self.fleet.now()) }
        }
    }

    /// As the coordinator's `deliver`: tokens adopted from a read now come from its version.
    private func deliver(_ read: Machine.StoreRead, _ version: Int64, _ event: () -> [Machine.Action]) {
        let before = machine.generation
        let actions = event()
        if machine.generation != before, case .tokens = read { baseVersion = version }
        execute(actions)
    }

    // MARK: - Actions

    private func execute(_ actions: [Machine.Action]) {
        queue += actions
        guard !executing else { return }
        executing = true
        defer { executing = false }
        while !queue.isEmpty { perform(queue.removeFirst()) }
    }

    private func perform(_ action: Machine.Action) {
        switch action {
        case .schedule(let timer, let at):
            timerSerial += 1
            let serial = timerSerial
            timers[timer] = serial
            later(at - fleet.clock) {
                guard self.timers[timer] == serial else { return }
                self.timers[timer] = nil
                self.execute(self.machine.timerFired(timer, now: self.fleet.now()))
            }
        case .cancel(let timer):
            timers[timer] = nil
        case .acquireLock(let timeout):
            lockSerial += 1
            lockWait = (fleet.clock + timeout, lockSerial)
            tryLock(lockSerial)
        case .releaseLock:
            lockWait = nil
            if holdsLock {
                holdsLock = false
                later(fleet.redisLatency) { self.fleet.unlock(self.index) }
            }
        case .recordInFlight(let record):
            later(fleet.redisLatency) {
                self.fleet.setInFlight(.record(record))
                self.execute(self.machine.inFlightRecorded(now: self.fleet.now()))
            }
        case .removeInFlightRecord:
            later(fleet.redisLatency) { self.fleet.setInFlight(.none) }
        case .presentRefreshToken(let tokens):
            later(fleet.tokenEndpointLatency / 2) {
                let result = self.fleet.tokenEndpoint(tokens.refreshToken, from: self.index)
                self.later(self.fleet.tokenEndpointLatency / 2) {
                    self.execute(self.machine.tokenEndpointAnswered(result, retryAfter: nil, now: self.fleet.now()))
                }
            }
        case .persist(let tokens):
            later(fleet.redisLatency) { self.write(tokens) }
        case .readStore:
            readStore { self.machine.storeRead($0, inFlight: $1, now: $2) }
        case .release(let outcome):
            let waiting = held
            held = []
            for _ in waiting {
                if case .renewed = outcome { send(machine.generation) } else { fleet.count(answer: 503) }
            }
        case .latchLoginRequired, .redact, .count, .log, .publish, .tokenEndpointIdle:
            break
        }
    }

    private func tryLock(_ serial: Int) {
        later(fleet.redisLatency) {
            guard let wait = self.lockWait, wait.serial == serial else { return }
            if let until = self.fleet.tryLock(self.index) {
                self.lockWait = nil
                self.holdsLock = true
                self.lockValidUntil = until
                self.readStore { read, inFlight, now in
                    // Under the lock what was read is what the next write replaces (`noteAdopted`).
                    self.baseVersion = self.lastReadVersion
                    return self.machine.lockAcquired(store: read, lockValidUntil: self.lockValidUntil, inFlight: inFlight, now: now)
                }
            } else if self.fleet.clock + 0.05 < wait.deadline {
                self.later(0.05) { self.tryLock(serial) }
            } else {
                self.lockWait = nil
                self.execute(self.machine.lockTimedOut(now: self.fleet.now()))
            }
        }
    }

    private func write(_ tokens: TokenSet) {
        if let version = fleet.compareAndSet(expected: baseVersion, tokens) {
            baseVersion = version
            lastReadVersion = version
            announcedVersion = max(announcedVersion, version)
            execute(machine.persisted(now: fleet.now()))
        } else {
            let (read, version) = fleet.read()
            lastReadVersion = version
            deliver(read, version) { machine.persistConflicted(read, now: fleet.now()) }
            baseVersion = version
        }
    }

    // MARK: - Load

    private func sendRequest() {
        later(fleet.requestInterval) {
            let (admission, actions) = self.machine.admit(now: self.fleet.now())
            self.execute(actions)
            switch admission {
            case .send(let generation): self.send(generation)
            case .hold: self.held.append(self.machine.generation)
            case .loginRequired, .unavailable: self.fleet.count(answer: 503)
            }
            self.sendRequest()
        }
    }

    /// One request with the token of `generation` (the one in service): 200, or a 401 the machine decides on.
    private func send(_ generation: UInt64) {
        let token = machine.tokens.accessToken
        later(0.002) {
            if self.fleet.upstreamAccepts(token) { return self.fleet.count(answer: 200) }
            let (decision, actions) = self.machine.unauthorized(sentGeneration: generation, now: self.fleet.now())
            self.execute(actions)
            switch decision {
            case .replay: self.send(self.machine.generation)
            case .hold: self.held.append(generation)
            case .passThrough: self.fleet.count(answer: 401)
            case .unavailable, .noRefresh: self.fleet.count(answer: 503)
            }
        }
    }
}

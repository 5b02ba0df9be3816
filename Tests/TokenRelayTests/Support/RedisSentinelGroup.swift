import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A replicated Redis watched by Sentinel, all on 127.0.0.1 ephemeral ports in temporary directories: a
/// master, `replicaCount` replicas (`--replicaof`) and three sentinels (`redis-server <conf> --sentinel`,
/// each with its own writable config, which Sentinel rewrites). Low `down-after-milliseconds` and
/// `failover-timeout` make a failover take one to three seconds. Every process is stopped by its PID.
final class RedisSentinelGroup: @unchecked Sendable {
    let masterName = "tokenrelay-test"
    private(set) var nodes: [RedisServerProcess] = []
    private(set) var sentinels: [SentinelProcess] = []

    /// With `sentinelPassword`, the sentinels require it (`requirepass`); the data nodes stay open.
    init(replicaCount: Int = 2, downAfterMilliseconds: Int = 500, failoverTimeoutMilliseconds: Int = 2000, sentinelPassword: String? = nil) throws {
        try RedisServerProcess.requireInstalled()
        // No pause before a full sync (Redis waits 5 s by default for more replicas to join one transfer):
        // a replica must hold the data, not only be connected, before WAIT can count it.
        let noDelay = ["--repl-diskless-sync-delay", "0"]
        let master = try RedisServerProcess(tcp: true, extraArguments: noDelay)
        nodes = [master]
        let masterPort = try XCTUnwrap(master.tcpPort)
        for _ in 0..<replicaCount {
            nodes.append(try RedisServerProcess(tcp: true, extraArguments: noDelay + ["--replicaof", "127.0.0.1", String(masterPort)]))
        }
        let synced = waitUntil(timeout: 10) {
            self.nodes.dropFirst().allSatisfy { ((try? $0.cli(["INFO", "replication"])) ?? "").contains("master_link_status:up") }
        }
        guard synced, waitUntil(timeout: 10, { ((try? master.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:\(replicaCount)") }) else {
            stop()
            throw TestSupportError("the replicas did not connect to the master within 10 s")
        }
        for _ in 0..<3 {
            sentinels.append(try SentinelProcess(masterName: masterName, masterPort: masterPort, downAfter: downAfterMilliseconds,
                                                 failoverTimeout: failoverTimeoutMilliseconds, password: sentinelPassword))
        }
        // A failover needs the sentinels to know each other (a majority authorises it) and the replicas:
        // both are learnt through the master, so wait until every sentinel has.
        let known = waitUntil(timeout: 20, interval: 0.1) {
            self.sentinels.allSatisfy { sentinel in
                let fields = sentinel.masterFields(self.masterName)
                return fields["num-other-sentinels"] == "2" && fields["num-slaves"] == String(replicaCount)
            }
        }
        guard known else {
            stop()
            throw TestSupportError("the sentinels did not discover each other and the replicas within 20 s")
        }
    }

    deinit { stop() }

    var addresses: [String] { sentinels.map { "127.0.0.1:\($0.port)" } }
    /// An address to name before the sentinels in the relays' config (one where nothing answers).
    var extraAddressFirst: String?

    /// The node the sentinels name as master now (asked of the first sentinel that answers).
    var masterPortNamedBySentinels: Int? { masterPortNamedBySentinels(skipping: nil) }

    /// The same, not asking the sentinel at `skipping` (one the test stalled).
    func masterPortNamedBySentinels(skipping: Int?) -> Int? {
        for (index, sentinel) in sentinels.enumerated() where index != skipping {
            if let output = try? sentinel.cli(["SENTINEL", "get-master-addr-by-name", masterName]) {
                let lines = output.split(separator: "\n")
                if lines.count == 2, let port = Int(lines[1]) { return port }
            }
        }
        return nil
    }

    /// The running node listening on `port`.
    func node(port: Int) -> RedisServerProcess? { nodes.first { $0.tcpPort == port && $0.pid != nil } }

    var currentMaster: RedisServerProcess? { masterPortNamedBySentinels.flatMap(node(port:)) }

    func stop() {
        sentinels.forEach { $0.stop() }
        nodes.forEach { $0.stop() }
    }
}

/// One `redis-server --sentinel` with its own config file in its own directory.
final class SentinelProcess: @unchecked Sendable {
    let port: Int
    let directory: URL
    private let password: String?
    private var process: Process?

    init(masterName: String, masterPort: Int, downAfter: Int, failoverTimeout: Int, password: String? = nil) throws {
        self.password = password
        directory = makeTemporaryDirectory(prefix: "tokenrelay-sentinel")
        port = try RedisServerProcess.freeLoopbackPort()
        let config = directory.appendingPathComponent("sentinel.conf")
        try """
        port \(port)
        bind 127.0.0.1
        dir \(directory.path)
        logfile \(directory.appendingPathComponent("sentinel.log").path)
        sentinel monitor \(masterName) 127.0.0.1 \(masterPort) 2
        sentinel down-after-milliseconds \(masterName) \(downAfter)
        sentinel failover-timeout \(masterName) \(failoverTimeout)
        sentinel parallel-syncs \(masterName) 2
        \(password.map { "requirepass \($0)" } ?? "")

        """.write(to: config, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["redis-server", config.path, "--sentinel", "--daemonize", "no"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        guard waitUntil(timeout: 10, interval: 0.02, { (try? self.cli(["PING"])) == "PONG" || !process.isRunning }), process.isRunning else {
            let log = (try? String(contentsOf: directory.appendingPathComponent("sentinel.log"), encoding: .utf8)) ?? ""
            stop()
            throw TestSupportError("redis sentinel did not answer PING within 10 s; log:\n\(log.suffix(2000))")
        }
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    var pid: Int32? { process?.processIdentifier }

    func stop() {
        guard let process, process.isRunning else { return }
        terminateRedisProcess(process)
        self.process = nil
    }

    @discardableResult
    func cli(_ arguments: [String]) throws -> String {
        let login = password.map { ["-a", $0, "--no-auth-warning"] } ?? []
        return try redisCLI(["-h", "127.0.0.1", "-p", String(port)] + login, arguments)
    }

    /// `SENTINEL master <name>` as field -> value.
    func masterFields(_ name: String) -> [String: String] {
        guard let output = try? cli(["SENTINEL", "master", name]) else { return [:] }
        let lines = output.split(separator: "\n").map(String.init)
        var fields: [String: String] = [:]
        var index = 0
        while index + 1 < lines.count {
            fields[lines[index]] = lines[index + 1]
            index += 2
        }
        return fields
    }
}

import Foundation
import XCTest
@testable import TokenRelay
#if canImport(Glibc)
import Glibc
#endif

/// sd_notify without libsystemd: the real binary, started with NOTIFY_SOCKET pointing at a datagram socket
/// this test owns, must report READY=1 once it serves, WATCHDOG=1 at half of WATCHDOG_USEC, and STOPPING=1
/// when SIGTERM starts the shutdown.
final class SystemdNotifyTests: RelayTestCase {
    func testReadyWatchdogAndStoppingOverPathSocket() throws {
        let socketPath = workDir.appendingPathComponent("notify.sock").path
        let receiver = try NotifyReceiver(path: socketPath)
        try assertNotifications(receiver: receiver, notifySocket: socketPath)
    }

    func testAbstractNamespaceSocket() throws {
        let name = "tokenrelay-test-\(getpid())-\(UUID().uuidString.prefix(8))"
        let receiver = try NotifyReceiver(abstractName: name)
        try assertNotifications(receiver: receiver, notifySocket: "@" + name)
    }

    private func assertNotifications(receiver: NotifyReceiver, notifySocket: String) throws {
        let relay = try TokenRelayProcess.start(
            config: config(),
            environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "NOTIFY_SOCKET": notifySocket, "WATCHDOG_USEC": "200000"],
            workDir: workDir)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("READY=1") }, "READY=1 never arrived: \(receiver.messages)")
        // READY=1 is only sent once the proxy serves.
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.filter { $0 == "WATCHDOG=1" }.count >= 2 },
                      "expected watchdog pings every 0.1 s: \(receiver.messages)")
        XCTAssertFalse(receiver.messages.contains("STOPPING=1"))
        relay.signal(SIGTERM)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("STOPPING=1") }, "STOPPING=1 never arrived: \(receiver.messages)")
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0)
        let lines = receiver.messages
        XCTAssertLessThan(try XCTUnwrap(lines.firstIndex(of: "READY=1")), try XCTUnwrap(lines.firstIndex(of: "STOPPING=1")))
        XCTAssertEqual(lines.filter { $0 == "READY=1" }.count, 1)
    }

    /// `systemctl reload` (ExecReload sends SIGHUP) under Type=notify: RELOADING=1 with MONOTONIC_USEC,
    /// then READY=1 once the reload is done, and the service keeps running.
    func testReloadIsAnnounced() throws {
        let socketPath = workDir.appendingPathComponent("notify.sock").path
        let receiver = try NotifyReceiver(path: socketPath)
        let relay = try TokenRelayProcess.start(
            config: config(), environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "NOTIFY_SOCKET": socketPath], workDir: workDir)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("READY=1") }, "\(receiver.messages)")
        relay.signal(SIGHUP)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.filter { $0 == "READY=1" }.count == 2 }, "\(receiver.messages)")
        let messages = receiver.messages
        let reloading = try XCTUnwrap(messages.firstIndex(of: "RELOADING=1"), "\(messages)")
        XCTAssertTrue(messages[reloading + 1].hasPrefix("MONOTONIC_USEC="), "\(messages)")
        XCTAssertGreaterThan(Int(messages[reloading + 1].dropFirst("MONOTONIC_USEC=".count)) ?? 0, 0)
        XCTAssertGreaterThan(try XCTUnwrap(messages.lastIndex(of: "READY=1")), reloading)
        XCTAssertEqual(try get(relay).status, 200)
        relay.signal(SIGTERM)
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0)
    }

    func testNoWatchdogWithoutWatchdogUsec() throws {
        let socketPath = workDir.appendingPathComponent("notify.sock").path
        let receiver = try NotifyReceiver(path: socketPath)
        let relay = try TokenRelayProcess.start(
            config: config(), environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "NOTIFY_SOCKET": socketPath],
            workDir: workDir)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("READY=1") }, "\(receiver.messages)")
        relay.signal(SIGTERM)
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("STOPPING=1") }, "\(receiver.messages)")
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0)
        XCTAssertFalse(receiver.messages.contains("WATCHDOG=1"))
    }

    /// sd_watchdog_enabled(3) semantics.
    func testWatchdogEnvironmentRules() {
        XCTAssertEqual(SystemdNotifier.watchdogInterval(usec: "30000000", pid: nil, ownPID: 42), 15)
        XCTAssertEqual(SystemdNotifier.watchdogInterval(usec: "200000", pid: "42", ownPID: 42), 0.1)
        XCTAssertEqual(SystemdNotifier.watchdogInterval(usec: "200000", pid: "", ownPID: 42), 0.1)
        XCTAssertNil(SystemdNotifier.watchdogInterval(usec: "200000", pid: "43", ownPID: 42), "watchdog meant for another process")
        XCTAssertNil(SystemdNotifier.watchdogInterval(usec: "200000", pid: "x", ownPID: 42))
        XCTAssertNil(SystemdNotifier.watchdogInterval(usec: "0", pid: nil, ownPID: 42))
        XCTAssertNil(SystemdNotifier.watchdogInterval(usec: "-5", pid: nil, ownPID: 42))
        XCTAssertNil(SystemdNotifier.watchdogInterval(usec: nil, pid: nil, ownPID: 42))
    }

    func testSocketAddressForms() throws {
        let path = try XCTUnwrap(SystemdNotifier.socketAddress("/run/systemd/notify"))
        XCTAssertEqual(Int(path.1), MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + "/run/systemd/notify".utf8.count + 1)
        let abstract = try XCTUnwrap(SystemdNotifier.socketAddress("@name"))
        XCTAssertEqual(Int(abstract.1), MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + 5)
        XCTAssertEqual(withUnsafeBytes(of: abstract.0.sun_path) { Array($0.prefix(5)) }, [0] + Array("name".utf8))
        XCTAssertNil(SystemdNotifier.socketAddress("relative/path"))
        XCTAssertNil(SystemdNotifier.socketAddress(""))
        XCTAssertNil(SystemdNotifier.socketAddress("/" + String(repeating: "x", count: 200)))
        let disabled = SystemdNotifier(environment: { _ in nil })
        XCTAssertFalse(disabled.isEnabled)
        disabled.send("READY=1") // a no-op, not a crash
    }
}

/// The test's end of NOTIFY_SOCKET: a bound AF_UNIX datagram socket; every datagram is split into its
/// newline-separated assignments, in arrival order.
final class NotifyReceiver {
    private let fd: Int32
    private let path: String?
    private(set) var messages: [String] = []

    convenience init(path: String) throws {
        try self.init(address: Array(path.utf8), abstract: false, path: path)
    }

    convenience init(abstractName: String) throws {
        try self.init(address: [0] + Array(abstractName.utf8), abstract: true, path: nil)
    }

    private init(address bytes: [UInt8], abstract: Bool, path: String?) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError(errnoContext: "socket(AF_UNIX)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            throw TestSupportError("socket address too long: \(bytes.count) bytes")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in bytes.enumerated() { raw[index] = byte }
        }
        let length = socklen_t(MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + bytes.count + (abstract ? 0 : 1))
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard result == 0 else {
            let error = TestSupportError(errnoContext: "bind notify socket")
            close(fd)
            throw error
        }
    }

    deinit {
        close(fd)
        if let path { unlink(path) }
    }

    private func drain() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return }
            messages += String(decoding: buffer[0..<n], as: UTF8.self).split(separator: "\n").map(String.init)
        }
    }

    /// Polls until `condition` holds for the messages received so far, or `timeout` passes.
    func waitFor(timeout: Double, _ condition: ([String]) -> Bool) -> Bool {
        waitUntil(timeout: timeout) {
            drain()
            return condition(messages)
        }
    }
}

import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A Linux network namespace (`ip netns add`) standing for a separate host in fleet tests. Every name
/// carries the test process's pid, so two test runs never share one. `delete()` is idempotent and
/// removes the namespace with its veth ends (a veth pair dies with either end).
final class NetworkNamespace: @unchecked Sendable {
    let name: String
    private let deleted = Locked(false)

    /// Skips the calling test with the reason when this machine does not let us create namespaces
    /// (not root, no CAP_SYS_ADMIN, no iproute2).
    static func requirePermitted() throws {
        guard toolExists("ip") else { throw XCTSkip("iproute2 (`ip`) is not installed (scripts/ensure-deps --test installs it)") }
        guard getuid() == 0 else { throw XCTSkip("network namespaces need root (`ip netns add`); running as uid \(getuid())") }
        let probe = "trprobe\(getpid())"
        let added = try runTool("ip", ["netns", "add", probe], timeout: 10)
        _ = try? runTool("ip", ["netns", "delete", probe], timeout: 10)
        guard added.exitCode == 0 else {
            throw XCTSkip("`ip netns add` is not permitted in this sandbox: \(added.stderr.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
    }

    /// `role` is a short tag (a few letters): the name is `tr<role><pid>`.
    init(role: String) throws {
        name = "tr\(role)\(getpid())"
        _ = try? runTool("ip", ["netns", "delete", name], timeout: 10) // a leftover of a killed run with our pid
        try Self.ip(["netns", "add", name])
        try ip(["link", "set", "lo", "up"])
    }

    /// `ip -n <name> …`
    func ip(_ arguments: [String]) throws {
        try Self.ip(["-n", name] + arguments)
    }

    /// A point-to-point link: a veth pair with one end here and one in `peer`, each with an address of
    /// one private /30 that exists only between these two namespaces.
    func link(to peer: NetworkNamespace, localName: String, peerName: String, localAddress: String, peerAddress: String) throws {
        try Self.ip(["link", "add", localName, "netns", name, "type", "veth", "peer", "name", peerName, "netns", peer.name])
        try ip(["addr", "add", localAddress + "/30", "dev", localName])
        try peer.ip(["addr", "add", peerAddress + "/30", "dev", peerName])
        try ip(["link", "set", localName, "up"])
        try peer.ip(["link", "set", peerName, "up"])
    }

    /// The command line that runs `command` inside this namespace (`ip netns exec` execs it: same pid).
    func wrapper(_ command: [String]) -> [String] {
        [Self.ipPath, "netns", "exec", name] + command
    }

    func delete() {
        guard deleted.withLock({ let was = $0; $0 = true; return !was }) else { return }
        _ = try? runTool("ip", ["netns", "delete", name], timeout: 10)
    }

    static var ipPath: String {
        ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "/usr/sbin/ip"
    }

    private static func ip(_ arguments: [String]) throws {
        let result = try runTool(ipPath, arguments, timeout: 10)
        guard result.exitCode == 0 else {
            throw TestSupportError("ip \(arguments.joined(separator: " ")): \(result.stderr.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
    }
}

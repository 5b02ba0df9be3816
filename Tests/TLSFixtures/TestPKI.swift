import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PKI made with the `openssl` command line once per test process (nothing long-lived is
/// committed), removed when the process exits: a CA, server certificates for the right host, the wrong
/// host and an expired one, a client certificate for mutual TLS, a stray key and a second CA. EC P-256
/// keys keep generation to a fraction of a second.
public struct TestPKI: Sendable {
    public struct Identity: Sendable {
        public let cert: URL
        public let key: URL
    }

    public let directory: URL
    public let caFile: URL
    /// SAN `DNS:localhost, IP:127.0.0.1`.
    public let server: Identity
    /// SAN `DNS:wrong.example.com` only.
    public let wrongHost: Identity
    /// SAN `DNS:localhost, IP:127.0.0.1`, valid only during 2020-01-01.
    public let expired: Identity
    /// CN `tls-test-client` (`clientCommonName`), extendedKeyUsage clientAuth.
    public let client: Identity
    /// A key that belongs to none of the certificates (for the mismatch error).
    public let strayKey: URL
    /// A second CA that signed none of the certificates (a wrong `ca_file`).
    public let otherCAFile: URL

    public static let clientCommonName = "tls-test-client"

    private static let generated = Result { () throws -> TestPKI in
        let dir = FileManager.default.temporaryDirectory
            .appendingPathComponent("tls-test-pki-\(getpid())-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        directoryLock.withLock { _directory = dir }
        atexit { if let dir = TestPKI.directoryToRemove { try? FileManager.default.removeItem(at: dir) } }
        return try generate(in: dir)
    }
    private static let directoryLock = NSLock()
    nonisolated(unsafe) private static var _directory: URL?
    private static var directoryToRemove: URL? { directoryLock.withLock { _directory } }

    public static func shared() throws -> TestPKI { try generated.get() }

    private static func generate(in dir: URL) throws -> TestPKI {
        func path(_ name: String) -> String { dir.appendingPathComponent(name).path }
        func identity(_ name: String) -> Identity {
            Identity(cert: dir.appendingPathComponent("\(name).pem"), key: dir.appendingPathComponent("\(name).key"))
        }
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try openssl(["req", "-x509"] + ec + ["-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "3",
                                             "-subj", "/CN=tls test CA"], in: dir)
        func issue(_ name: String, cn: String, extensions: String) throws {
            try openssl(["req"] + ec + ["-keyout", path("\(name).key"), "-out", path("\(name).csr"), "-subj", "/CN=\(cn)"], in: dir)
            try extensions.write(toFile: path("\(name).ext"), atomically: true, encoding: .utf8)
            try openssl(["x509", "-req", "-in", path("\(name).csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                         "-set_serial", "\(UInt32.random(in: 1...UInt32.max))", "-extfile", path("\(name).ext"),
                         "-out", path("\(name).pem"), "-days", "3"], in: dir)
        }
        let serverExtensions = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        try issue("server", cn: "localhost", extensions: serverExtensions)
        try issue("wrong-host", cn: "wrong.example.com", extensions: "subjectAltName=DNS:wrong.example.com\nextendedKeyUsage=serverAuth\n")
        try issue("client", cn: clientCommonName, extensions: "extendedKeyUsage=clientAuth\n")
        try issueExpired(in: dir, extensions: serverExtensions)
        try openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", path("stray.key")], in: dir)
        try openssl(["req", "-x509"] + ec + ["-keyout", path("other-ca.key"), "-out", path("other-ca.pem"), "-days", "3",
                                             "-subj", "/CN=tls other test CA"], in: dir)
        return TestPKI(directory: dir, caFile: dir.appendingPathComponent("ca.pem"), server: identity("server"),
                       wrongHost: identity("wrong-host"), expired: identity("expired"), client: identity("client"),
                       strayKey: dir.appendingPathComponent("stray.key"), otherCAFile: dir.appendingPathComponent("other-ca.pem"))
    }

    /// OpenSSL 3.0's `x509 -req` cannot set a start date in the past; `openssl ca` can (`-startdate`).
    private static func issueExpired(in dir: URL, extensions: String) throws {
        func path(_ name: String) -> String { dir.appendingPathComponent(name).path }
        let database = dir.appendingPathComponent("ca-db")
        try FileManager.default.createDirectory(at: database, withIntermediateDirectories: true)
        try "".write(toFile: database.appendingPathComponent("index.txt").path, atomically: true, encoding: .utf8)
        try "1000\n".write(toFile: database.appendingPathComponent("serial").path, atomically: true, encoding: .utf8)
        let config = """
            [ca]
            default_ca = test_ca
            [test_ca]
            database = \(database.path)/index.txt
            serial = \(database.path)/serial
            new_certs_dir = \(database.path)
            default_md = sha256
            policy = any_name
            unique_subject = no
            [any_name]
            commonName = supplied
            [server_ext]
            \(extensions)
            """
        try config.write(toFile: path("ca.cnf"), atomically: true, encoding: .utf8)
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try openssl(["req"] + ec + ["-keyout", path("expired.key"), "-out", path("expired.csr"), "-subj", "/CN=localhost"], in: dir)
        try openssl(["ca", "-batch", "-notext", "-config", path("ca.cnf"), "-extensions", "server_ext", "-cert", path("ca.pem"),
                     "-keyfile", path("ca.key"), "-in", path("expired.csr"), "-out", path("expired.pem"),
                     "-startdate", "20200101000000Z", "-enddate", "20200102000000Z"], in: dir)
    }

    private static func openssl(_ arguments: [String], in dir: URL) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl"] + arguments
        process.currentDirectoryURL = dir
        let log = dir.appendingPathComponent("openssl.log")
        if !FileManager.default.fileExists(atPath: log.path) { _ = FileManager.default.createFile(atPath: log.path, contents: nil) }
        let handle = try FileHandle(forWritingTo: log)
        defer { try? handle.close() }
        handle.seekToEndOfFile()
        process.standardOutput = handle
        process.standardError = handle
        process.standardInput = FileHandle.nullDevice
        try process.run()
        guard pollUntil(timeout: 30, { !process.isRunning }) else {
            kill(process.processIdentifier, SIGKILL)
            throw TLSFixtureError("openssl \(arguments.first ?? "") did not finish within 30 s")
        }
        guard process.terminationStatus == 0 else {
            let output = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
            throw TLSFixtureError("openssl \(arguments.joined(separator: " ")) failed (\(process.terminationStatus)):\n\(output)")
        }
    }
}

public struct TLSFixtureError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Polls `condition` every 10 ms until it holds or `timeout` seconds pass (waiting on a child process or its
/// output file, which give no event to wait on); true when it held.
@discardableResult
func pollUntil(timeout: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while !condition() {
        if Date() >= deadline { return false }
        usleep(10_000)
    }
    return true
}

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The real `tokenrelay` binary running as a child process, for black-box tests.
///
/// Output goes to files in `workDir` rather than pipes: a pipe that nobody drains fills up and
/// blocks the product mid-log, which would look like a product hang. Stopping is by PID and
/// signal (SIGTERM, then SIGKILL after a grace period) so graceful-shutdown behaviour is
/// testable, and `deinit` stops it too so a failing test cannot leak a running proxy.
final class TokenRelayProcess: @unchecked Sendable { // all mutable state is inside `process`
    let proxyPort: Int
    /// 0 when the admin listener is disabled in the config.
    let adminPort: Int
    let workDir: URL
    let configURL: URL
    let stdoutURL: URL
    let stderrURL: URL
    private let process: Process

    var pid: Int32 { process.processIdentifier }
    var proxyURL: String { "http://127.0.0.1:\(proxyPort)" }
    var adminURL: String { "http://127.0.0.1:\(adminPort)" }
    var isRunning: Bool { process.isRunning }
    var stderrText: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }
    var stdoutText: String { (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? "" }

    private init(process: Process, proxyPort: Int, adminPort: Int, workDir: URL, configURL: URL) {
        self.process = process
        self.proxyPort = proxyPort
        self.adminPort = adminPort
        self.workDir = workDir
        self.configURL = configURL
        stdoutURL = workDir.appendingPathComponent("stdout.log")
        stderrURL = workDir.appendingPathComponent("stderr.log")
    }

    deinit { stop() }

    /// Writes `config` to `workDir/config.json`, runs `tokenrelay run --config <path>` (plus
    /// `extraArguments`) with cwd `workDir`, and waits until stderr shows the startup line
    /// `... msg=listening ... proxy=127.0.0.1:PORT ...` (with `admin=127.0.0.1:PORT` unless disabled).
    /// `wrapper`, when given, is the command line that runs the binary (e.g. `[valgrind, options…, binary]`);
    /// the `run` arguments are appended to it.
    static func start(config: [String: Any], environment: [String: String] = [:], workDir: URL,
                      extraArguments: [String] = [], wrapper: [String] = [], startupTimeout: Double = 15) throws -> TokenRelayProcess {
        let configURL = workDir.appendingPathComponent("config.json")
        try JSONSerialization.data(withJSONObject: config, options: [.prettyPrinted, .sortedKeys]).write(to: configURL)
        let process = try launch(arguments: ["run", "--config", configURL.path] + extraArguments,
                                 environment: environment, workDir: workDir,
                                 stdout: workDir.appendingPathComponent("stdout.log"),
                                 stderr: workDir.appendingPathComponent("stderr.log"), wrapper: wrapper)
        var instance: TokenRelayProcess?
        let stderrURL = workDir.appendingPathComponent("stderr.log")
        let started = waitUntil(timeout: startupTimeout) {
            let text = (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? ""
            if let ports = parseListeningLine(text) {
                instance = TokenRelayProcess(process: process, proxyPort: ports.proxy, adminPort: ports.admin,
                                             workDir: workDir, configURL: configURL)
                return true
            }
            return !process.isRunning
        }
        if started, let instance { return instance }
        let running = process.isRunning
        terminate(process, grace: 5)
        let stderr = (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? ""
        throw TestSupportError(running
            ? "tokenrelay did not log its listening line within \(startupTimeout) s; stderr:\n\(stderr)"
            : "tokenrelay exited with \(exitCode(of: process)) before listening; stderr:\n\(stderr)")
    }

    /// Runs `tokenrelay <arguments>` to completion (e.g. `check --config X`); killed after `timeout`.
    /// `stdin` is fed from a file (not a pipe, so a child that does not read it cannot block the test).
    static func runCommand(arguments: [String], environment: [String: String] = [:], stdin: Data? = nil,
                           timeout: Double = 30) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let dir = makeTemporaryDirectory(prefix: "tokenrelay-cmd")
        defer { try? FileManager.default.removeItem(at: dir) }
        let out = dir.appendingPathComponent("stdout.log"), err = dir.appendingPathComponent("stderr.log")
        var input: URL?
        if let stdin {
            input = dir.appendingPathComponent("stdin")
            try stdin.write(to: input!)
        }
        let process = try launch(arguments: arguments, environment: environment,
                                 workDir: URL(fileURLWithPath: FileManager.default.currentDirectoryPath),
                                 stdout: out, stderr: err, stdin: input)
        guard waitUntil(timeout: timeout, { !process.isRunning }) else {
            terminate(process, grace: 0)
            throw TestSupportError("tokenrelay \(arguments.joined(separator: " ")) did not finish within \(timeout) s")
        }
        return (exitCode(of: process),
                (try? String(contentsOf: out, encoding: .utf8)) ?? "",
                (try? String(contentsOf: err, encoding: .utf8)) ?? "")
    }

    /// Sends `sig` (e.g. SIGHUP for reload, SIGTERM for graceful stop) if the process still runs.
    func signal(_ sig: Int32) {
        if process.isRunning { kill(process.processIdentifier, sig) }
    }

    /// The exit code once the process has exited within `timeout`, else nil. Death by signal N is
    /// reported as 128 + N, like a shell does.
    @discardableResult
    func waitForExit(timeout: Double) -> Int32? {
        waitUntil(timeout: timeout) { !process.isRunning } ? Self.exitCode(of: process) : nil
    }

    /// SIGTERM, up to 10 s grace, then SIGKILL. Idempotent; returns the exit code.
    @discardableResult
    func stop() -> Int32? {
        Self.terminate(process, grace: 10)
        return process.isRunning ? nil : Self.exitCode(of: process)
    }

    // MARK: - Helpers

    /// Ports from the first `msg=listening` logfmt line. Keys are matched independently because the
    /// product's logfmt handler sorts metadata keys (`admin=… generation=… proxy=… upstream=…`);
    /// `admin=disabled` yields admin port 0.
    static func parseListeningLine(_ log: String) -> (proxy: Int, admin: Int)? {
        // logfmt (`proxy=127.0.0.1:8080`) or JSON (`"proxy":"127.0.0.1:8080"`) log lines.
        for line in log.split(separator: "\n")
        where line.contains("msg=listening") || line.contains("msg=\"listening\"") || line.contains("\"msg\":\"listening\"") {
            guard let proxy = line.firstMatch(of: #/(?:^|[\s,{])"?proxy"?[=:]"?[0-9.]+:([0-9]+)/#).flatMap({ Int($0.output.1) })
            else { continue }
            let admin = line.firstMatch(of: #/(?:^|[\s,{])"?admin"?[=:]"?[0-9.]+:([0-9]+)/#).flatMap { Int($0.output.1) } ?? 0
            return (proxy, admin)
        }
        return nil
    }

    /// `TOKENRELAY_BIN`, else `tokenrelay` next to the running test binary/bundle (SwiftPM puts
    /// both in `.build/<triple>/debug`), else `./.build/debug/tokenrelay`.
    static func binaryURL() throws -> URL {
        let fm = FileManager.default
        if let path = ProcessInfo.processInfo.environment["TOKENRELAY_BIN"], !path.isEmpty {
            guard fm.isExecutableFile(atPath: path) else { throw TestSupportError("TOKENRELAY_BIN=\(path) is not an executable file") }
            return URL(fileURLWithPath: path)
        }
        var dirs: [URL] = []
        if let exe = try? fm.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            dirs.append(URL(fileURLWithPath: exe).deletingLastPathComponent())
        }
        dirs.append(URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent())
        dirs.append(Bundle.main.bundleURL)
        dirs.append(Bundle.main.bundleURL.deletingLastPathComponent())
        for bundle in Bundle.allBundles where bundle.bundlePath.hasSuffix(".xctest") { // macOS: beside the bundle
            dirs.append(bundle.bundleURL.deletingLastPathComponent())
        }
        dirs.append(URL(fileURLWithPath: fm.currentDirectoryPath).appendingPathComponent(".build/debug"))
        var candidates: [URL] = []
        for url in dirs.map({ $0.appendingPathComponent("tokenrelay").standardizedFileURL })
        where !candidates.contains(url) { candidates.append(url) }
        if let found = candidates.first(where: { fm.isExecutableFile(atPath: $0.path) && !isDirectory($0) }) { return found }
        throw TestSupportError("tokenrelay binary not found (build it with `swift build`, or set TOKENRELAY_BIN); looked at:\n"
            + candidates.map(\.path).joined(separator: "\n"))
    }

    private static func isDirectory(_ url: URL) -> Bool {
        var isDir: ObjCBool = false
        return FileManager.default.fileExists(atPath: url.path, isDirectory: &isDir) && isDir.boolValue
    }

    /// The child gets a minimal environment (PATH, plus LLVM_PROFILE_FILE for coverage runs) with
    /// `environment` on top, so nothing from the developer's shell changes its behaviour.
    private static func launch(arguments: [String], environment: [String: String], workDir: URL,
                               stdout: URL, stderr: URL, stdin: URL? = nil, wrapper: [String] = []) throws -> Process {
        let parent = ProcessInfo.processInfo.environment
        var env = ["PATH": parent["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"]
        env["LLVM_PROFILE_FILE"] = parent["LLVM_PROFILE_FILE"]
        env.merge(environment) { _, new in new }
        for url in [stdout, stderr] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        let process = Process()
        if let program = wrapper.first {
            process.executableURL = URL(fileURLWithPath: program)
            process.arguments = Array(wrapper.dropFirst()) + arguments
        } else {
            process.executableURL = try binaryURL()
            process.arguments = arguments
        }
        process.environment = env
        process.currentDirectoryURL = workDir
        let inHandle = try stdin.map { try FileHandle(forReadingFrom: $0) }
        defer { try? inHandle?.close() }
        process.standardInput = inHandle ?? FileHandle.nullDevice
        let outHandle = try FileHandle(forWritingTo: stdout), errHandle = try FileHandle(forWritingTo: stderr)
        defer { try? outHandle.close(); try? errHandle.close() } // the child has its own copies
        process.standardOutput = outHandle
        process.standardError = errHandle
        try process.run()
        return process
    }

    private static func terminate(_ process: Process, grace: Double) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if waitUntil(timeout: grace, { !process.isRunning }) { return }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        waitUntil(timeout: 10) { !process.isRunning }
    }

    private static func exitCode(of process: Process) -> Int32 {
        guard !process.isRunning else { return -1 }
        return process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
    }
}

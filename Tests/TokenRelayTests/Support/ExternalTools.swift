import Foundation

/// The repository checkout these tests belong to (for config/, deploy/, scripts/).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

/// The helper programs and data files the tests run from the source tree (not resources: Package.swift
/// excludes the folder), for test files in any subfolder.
let testFixtures = repositoryRoot.appendingPathComponent("Tests/TokenRelayTests/Fixtures")

struct ToolResult {
    let exitCode: Int32
    let stdout: String
    let stderr: String
}

/// Runs an external program (python3, systemd-analyze, ldd, dpkg) to completion, killed after `timeout`.
/// Output goes to files, not pipes, so a chatty tool cannot block on a full pipe nobody reads.
/// `executable` without a slash is looked up in PATH.
func runTool(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
             currentDirectory: URL? = nil, timeout: Double = 60) throws -> ToolResult {
    let dir = makeTemporaryDirectory(prefix: "tokenrelay-tool")
    defer { try? FileManager.default.removeItem(at: dir) }
    let out = dir.appendingPathComponent("stdout"), err = dir.appendingPathComponent("stderr")
    for url in [out, err] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
    let process = Process()
    if executable.contains("/") {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
    } else {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [executable] + arguments
    }
    if let environment { process.environment = environment }
    if let currentDirectory { process.currentDirectoryURL = currentDirectory }
    process.standardInput = FileHandle.nullDevice
    let outHandle = try FileHandle(forWritingTo: out), errHandle = try FileHandle(forWritingTo: err)
    process.standardOutput = outHandle
    process.standardError = errHandle
    do {
        try process.run()
    } catch {
        try? outHandle.close(); try? errHandle.close()
        throw TestSupportError("cannot run \(executable): \(error)")
    }
    try? outHandle.close(); try? errHandle.close()
    guard waitUntil(timeout: timeout, interval: 0.02, { !process.isRunning }) else {
        process.terminate()
        waitUntil(timeout: 5) { !process.isRunning }
        throw TestSupportError("\(executable) \(arguments.prefix(3).joined(separator: " ")) did not finish within \(timeout) s")
    }
    return ToolResult(exitCode: process.terminationStatus,
                      stdout: (try? String(contentsOf: out, encoding: .utf8)) ?? "",
                      stderr: (try? String(contentsOf: err, encoding: .utf8)) ?? "")
}

/// Whether `command` is on PATH.
func toolExists(_ command: String) -> Bool {
    (try? runTool("sh", ["-c", "command -v \"$0\" >/dev/null", command], timeout: 10).exitCode) == 0
}

/// python3 with the `jsonschema` and `yaml` (PyYAML) modules. If either is missing, `scripts/ensure-deps
/// --test` installs the Debian packages once per test process; a failure to do so fails the test with the
/// installer's output instead of skipping it.
enum Python {
    private static let ready = Locked<Result<Void, TestSupportError>?>(nil)

    static func ensureModules() throws {
        try ready.withLock { state in
            let outcome = state ?? install()
            state = outcome
            return try outcome.get()
        }
    }

    private static func install() -> Result<Void, TestSupportError> {
        let probe = { try? runTool("python3", ["-c", "import jsonschema, yaml"], timeout: 30) }
        if probe()?.exitCode == 0 { return .success(()) }
        let installer = try? runTool(repositoryRoot.appendingPathComponent("scripts/ensure-deps").path, ["--test"], timeout: 600)
        if probe()?.exitCode == 0 { return .success(()) }
        return .failure(TestSupportError("python3 modules jsonschema/yaml missing and scripts/ensure-deps --test could not install them: "
            + "\(installer?.stderr ?? "installer did not run")"))
    }

    /// Runs `script` with `python3 -c`; `arguments` become sys.argv[1...]. Stdout must be one JSON value.
    static func json(_ script: String, _ arguments: [String], timeout: Double = 60) throws -> Any {
        try ensureModules()
        let result = try runTool("python3", ["-c", script] + arguments, timeout: timeout)
        guard result.exitCode == 0 else {
            throw TestSupportError("python3 failed (\(result.exitCode)): \(result.stderr)")
        }
        do {
            return try JSONSerialization.jsonObject(with: Data(result.stdout.utf8), options: [.fragmentsAllowed])
        } catch {
            throw TestSupportError("python3 printed no JSON: \(result.stdout.prefix(500)) \(result.stderr)")
        }
    }
}

/// config/tokenrelay.schema.json applied by the maintained `jsonschema` package (Draft 2020-12), never by
/// a validator of our own.
enum ConfigSchema {
    static let url = repositoryRoot.appendingPathComponent("config/tokenrelay.schema.json")

    private static let script = """
        import json, sys
        from jsonschema import Draft202012Validator
        with open(sys.argv[1]) as f:
            schema = json.load(f)
        Draft202012Validator.check_schema(schema)
        validator = Draft202012Validator(schema)
        result = {}
        for path in sys.argv[2:]:
            with open(path) as f:
                instance = json.load(f)
            errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
            result[path] = ["/".join(map(str, e.absolute_path)) + ": " + e.message for e in errors]
        print(json.dumps(result))
        """

    /// Schema errors per file (empty list: valid). Also fails if the schema itself is not a valid 2020-12 schema.
    static func errors(for files: [URL]) throws -> [String: [String]] {
        guard let result = try Python.json(script, [url.path] + files.map(\.path)) as? [String: [String]] else {
            throw TestSupportError("unexpected validator output")
        }
        return result
    }

    static func errors(forObject object: [String: Any], in directory: URL) throws -> [String] {
        let file = directory.appendingPathComponent("instance-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: object).write(to: file)
        return try errors(for: [file])[file.path] ?? ["validator returned nothing"]
    }
}

/// Multi-document YAML parsed by PyYAML (`safe_load_all`), as JSON-compatible objects.
func loadYAMLDocuments(_ url: URL) throws -> [[String: Any]] {
    let script = """
        import json, sys, yaml
        with open(sys.argv[1]) as f:
            print(json.dumps([d for d in yaml.safe_load_all(f) if d is not None]))
        """
    guard let documents = try Python.json(script, [url.path]) as? [[String: Any]] else {
        throw TestSupportError("\(url.lastPathComponent): not a list of YAML mappings")
    }
    return documents
}

import Foundation
import XCTest

/// deploy/container/Containerfile, checked without a container engine (none runs here): the runtime stage
/// installs a package for every shared library the binary loads.
///
/// Fast variant: `ldd` on the debug binary the suite already built, ignoring the Swift runtime libraries
/// (the image links them statically). Slow variant (TOKENRELAY_SLOW_TESTS=1, about a minute): builds the
/// release binary with `--static-swift-stdlib`, as the Containerfile does, into .build-static and checks it
/// has no Swift runtime dependency left. Owning packages come from `dpkg -S` on this Debian 12 host, the
/// same release as the image; a library is covered when its package is one the Containerfile installs, a
/// dependency of one (apt installs those too), or part of debian:bookworm-slim itself (glibc, and `apt`
/// with its dependencies such as libstdc++6 and libgcc-s1).
final class ContainerfileTests: XCTestCase {
    private let containerfileURL = repositoryRoot.appendingPathComponent("deploy/container/Containerfile")

    private struct Stage {
        var from: String
        var instructions: [(keyword: String, arguments: String)] = []
    }

    /// Instructions with `\` continuations joined, grouped into stages; `ARG` defaults substituted in FROM.
    private func parse() throws -> [Stage] {
        var logical: [String] = []
        var current = ""
        for raw in try String(contentsOf: containerfileURL, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false) {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if current.isEmpty && (line.isEmpty || line.hasPrefix("#")) { continue }
            if line.hasPrefix("#") { continue } // comment inside a continued instruction
            if line.hasSuffix("\\") {
                current += line.dropLast() + " "
            } else {
                logical.append(current + line)
                current = ""
            }
        }
        var arguments: [String: String] = [:]
        var stages: [Stage] = []
        for line in logical {
            let parts = line.split(separator: " ", maxSplits: 1).map(String.init)
            let keyword = parts[0].uppercased(), rest = parts.count > 1 ? parts[1] : ""
            if keyword == "ARG", stages.isEmpty, let equals = rest.firstIndex(of: "=") {
                arguments[String(rest[..<equals])] = String(rest[rest.index(after: equals)...])
            } else if keyword == "FROM" {
                var image = rest
                for (name, value) in arguments { image = image.replacingOccurrences(of: "${\(name)}", with: value) }
                stages.append(Stage(from: image))
            } else if !stages.isEmpty {
                stages[stages.count - 1].instructions.append((keyword, rest))
            }
        }
        return stages
    }

    /// Packages named after `apt-get install` in the stage's RUN instructions.
    private func installedPackages(_ stage: Stage) -> [String] {
        var packages: [String] = []
        for instruction in stage.instructions where instruction.keyword == "RUN" {
            for command in instruction.arguments.components(separatedBy: "&&") {
                let words = command.split(whereSeparator: \.isWhitespace).map(String.init)
                guard let install = words.firstIndex(of: "install"), words[..<install].contains("apt-get") else { continue }
                packages += words[(install + 1)...].filter { !$0.hasPrefix("-") }
            }
        }
        return packages
    }

    func testStagesAndRuntimeSetup() throws {
        let stages = try parse()
        XCTAssertEqual(stages.count, 2)
        let build = try XCTUnwrap(stages.first), runtime = try XCTUnwrap(stages.last)
        XCTAssertNotNil(build.from.firstMatch(of: #/swift:6\.[0-9.]+-bookworm AS build$/#), build.from)
        XCTAssertTrue(build.instructions.contains { $0.keyword == "RUN" && $0.arguments.contains("swift build -c release --static-swift-stdlib") })
        XCTAssertTrue(runtime.from.hasSuffix("debian:bookworm-slim"), runtime.from)
        XCTAssertEqual(Set(installedPackages(runtime)),
                       ["libevent-2.1-7", "libevent-openssl-2.1-7", "libevent-pthreads-2.1-7", "libhiredis0.14", "libnghttp2-14", "libssl3",
                        "ca-certificates"])
        let user = try XCTUnwrap(runtime.instructions.last { $0.keyword == "USER" }?.arguments)
        XCTAssertFalse(["root", "0", "0:0"].contains(user), "runs as root")
        XCTAssertTrue(runtime.instructions.contains { $0.keyword == "VOLUME" && $0.arguments.contains("/var/lib/tokenrelay") })
        XCTAssertEqual(runtime.instructions.last { $0.keyword == "ENTRYPOINT" }?.arguments,
                       #"["/usr/local/bin/tokenrelay", "run", "--config", "/etc/tokenrelay/config.json"]"#)
    }

    func testRuntimePackagesCoverDebugBinaryLibraries() throws {
        try assertLibrariesCovered(binary: try TokenRelayProcess.binaryURL().path, allowSwiftRuntime: true)
    }

    func testStaticReleaseBinaryNeedsOnlyRuntimePackages() throws {
        guard ProcessInfo.processInfo.environment["TOKENRELAY_SLOW_TESTS"] == "1" else {
            throw XCTSkip("builds a release binary with --static-swift-stdlib (~1 min); set TOKENRELAY_SLOW_TESTS=1")
        }
        let scratch = repositoryRoot.appendingPathComponent(".build-static").path
        let arguments = ["build", "-c", "release", "--static-swift-stdlib", "--scratch-path", scratch, "--product", "tokenrelay"]
        let build = try runTool("swift", arguments, currentDirectory: repositoryRoot, timeout: 1200)
        XCTAssertEqual(build.exitCode, 0, build.stderr + build.stdout)
        let binPath = try runTool("swift", Array(arguments.dropLast(2)) + ["--show-bin-path"], currentDirectory: repositoryRoot, timeout: 120)
        let binary = binPath.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + "/tokenrelay"
        try assertLibrariesCovered(binary: binary, allowSwiftRuntime: false)
    }

    private func assertLibrariesCovered(binary: String, allowSwiftRuntime: Bool, file: StaticString = #filePath, line: UInt = #line) throws {
        let ldd = try runTool("ldd", [binary], timeout: 30)
        XCTAssertEqual(ldd.exitCode, 0, ldd.stderr, file: file, line: line)
        var libraries: [String] = []
        for entry in ldd.stdout.split(separator: "\n") {
            let fields = entry.split(whereSeparator: \.isWhitespace).map(String.init)
            guard let arrow = fields.firstIndex(of: "=>"), arrow + 1 < fields.count else { continue } // vdso, ld.so
            let path = fields[arrow + 1]
            XCTAssertTrue(path.hasPrefix("/"), "unresolved library: \(entry)", file: file, line: line)
            if path.contains("/lib/swift/") {
                XCTAssertTrue(allowSwiftRuntime, "Swift runtime library left dynamic: \(entry)", file: file, line: line)
                continue
            }
            libraries.append(path)
        }
        XCTAssertTrue(libraries.contains { $0.contains("libevent") }, "ldd output unexpected: \(ldd.stdout)", file: file, line: line)

        let runtime = try XCTUnwrap(try parse().last)
        let allowed = try dependencyClosure(Set(installedPackages(runtime)).union(["apt", "libc6"]))
        let owners = try owningPackages(libraries)
        for library in libraries {
            guard let owner = owners[library] else {
                XCTFail("\(library) belongs to no Debian package", file: file, line: line)
                continue
            }
            XCTAssertTrue(allowed.contains(owner), "\(library) comes from \(owner), which the runtime stage does not install",
                          file: file, line: line)
        }
    }

    /// One `dpkg -S` for every library, under the path ldd printed, its resolved form, and the other side
    /// of merged /usr (dpkg knows each file under one of them).
    private func owningPackages(_ libraries: [String]) throws -> [String: String] {
        var candidates: [String: String] = [:] // candidate path -> library
        for library in libraries {
            let resolved = URL(fileURLWithPath: library).resolvingSymlinksInPath().path
            for path in [library, resolved] {
                candidates[path] = library
                candidates[path.hasPrefix("/usr/") ? String(path.dropFirst(4)) : "/usr" + path] = library
            }
        }
        // Exit status 1 when some candidate is unknown; the known ones are still printed ("pkg:arch: path").
        let result = try runTool("dpkg", ["-S"] + candidates.keys.sorted(), timeout: 60)
        var owners: [String: String] = [:]
        for entry in result.stdout.split(separator: "\n") {
            guard let separator = entry.range(of: ": ") else { continue }
            let path = String(entry[separator.upperBound...])
            guard let library = candidates[path] else { continue }
            owners[library] = String(entry[..<separator.lowerBound].split(separator: ":")[0])
        }
        return owners
    }

    /// `packages` and everything they Depend/Pre-Depend on, by the host's dpkg database (alternatives all
    /// count). A package not installed here owns no library on this host either, so it is not followed.
    private func dependencyClosure(_ packages: Set<String>) throws -> Set<String> {
        var seen = packages
        var level = packages
        while !level.isEmpty {
            let result = try runTool("dpkg-query", ["-W", "-f=${Depends}, ${Pre-Depends}\n"] + level.sorted(), timeout: 60)
            level = []
            for dependency in result.stdout.split(whereSeparator: { $0 == "," || $0 == "|" || $0 == "\n" }) {
                guard let name = dependency.split(whereSeparator: \.isWhitespace).first?.split(separator: ":").first else { continue }
                if seen.insert(String(name)).inserted { level.insert(String(name)) }
            }
        }
        return seen
    }
}

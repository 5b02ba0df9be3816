import Foundation
import XCTest

/// The layering the package promises, read from the sources: libevent and OpenSSL are reached only
/// through HTTPTransport, hiredis only through RedisProtocol, and HTTPTransport's public API names no C
/// type. (A libevent call elsewhere is also a compile error, since no other target depends on CLibevent;
/// this test keeps a dependency from being added back quietly.)
final class ArchitectureBoundaryTests: XCTestCase {
    private let sources = repositoryRoot.appendingPathComponent("Sources")

    private func swiftFiles() throws -> [(target: String, path: String, text: String)] {
        var files: [(String, String, String)] = []
        let enumerator = try XCTUnwrap(FileManager.default.enumerator(atPath: sources.path))
        for case let relative as String in enumerator where relative.hasSuffix(".swift") {
            let text = try String(contentsOf: sources.appendingPathComponent(relative), encoding: .utf8)
            files.append((String(relative.split(separator: "/")[0]), relative, text))
        }
        XCTAssertGreaterThan(files.count, 50, "found the sources at \(sources.path)")
        return files
    }

    private func imports(_ module: String, _ text: String) -> Bool {
        text.split(separator: "\n").contains { line in
            let words = line.split(separator: " ")
            return words.last == Substring(module) && words.dropLast().allSatisfy { ["import", "internal", "@_implementationOnly", "private", "fileprivate", "public", "package"].contains(String($0)) }
                && words.contains("import")
        }
    }

    func testOnlyHTTPTransportImportsLibevent() throws {
        let offenders = try swiftFiles().filter { $0.target != "HTTPTransport" && imports("CLibevent", $0.text) }.map(\.path)
        XCTAssertEqual(offenders, [], "libevent outside HTTPTransport")
    }

    func testOnlyHTTPTransportImportsNghttp2() throws {
        let offenders = try swiftFiles().filter { $0.target != "HTTPTransport" && imports("CNghttp2", $0.text) }.map(\.path)
        XCTAssertEqual(offenders, [], "nghttp2 outside HTTPTransport")
    }

    func testOnlyRedisProtocolImportsHiredis() throws {
        let offenders = try swiftFiles().filter { $0.target != "RedisProtocol" && imports("CHiredis", $0.text) }.map(\.path)
        XCTAssertEqual(offenders, [], "hiredis outside RedisProtocol")
    }

    func testOnlyJOSEImportsTheOpenSSLCryptoShim() throws {
        let offenders = try swiftFiles().filter { $0.target != "JOSE" && imports("CJOSECrypto", $0.text) }.map(\.path)
        XCTAssertEqual(offenders, [], "CJOSECrypto outside JOSE")
    }

    func testHTTPTransportsPublicAPINamesNoCType() throws {
        var offenders: [String] = []
        for file in try swiftFiles() where file.target == "HTTPTransport" {
            for line in file.text.split(separator: "\n") where line.contains("public ") && !line.trimmingCharacters(in: .whitespaces).hasPrefix("//") {
                if line.contains("OpaquePointer") || line.contains("evbuffer") || line.contains("event_base") || line.contains("UnsafeMutablePointer<SSL") || line.contains("nghttp2_") {
                    offenders.append("\(file.path): \(line.trimmingCharacters(in: .whitespaces))")
                }
            }
        }
        XCTAssertEqual(offenders, [], "C types in HTTPTransport's public API")
    }
}

import Foundation
import XCTest
import JOSE

/// Runs the `openssl` command line and python3 as independent verifiers, in a per-test temporary directory.
final class Scratch {
    let directory: URL

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("jose-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    deinit {
        try? FileManager.default.removeItem(at: directory)
    }

    func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        try Data(bytes).write(to: URL(fileURLWithPath: path(name)))
        return path(name)
    }

    func read(_ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: URL(fileURLWithPath: path(name))))
    }

    /// Runs a program to completion (bounded by its own work: no program here waits for input it does not get).
    @discardableResult
    func run(_ program: String, _ arguments: [String], input: [UInt8] = []) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [program] + arguments
        process.currentDirectoryURL = directory
        let stdin = Pipe(), stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stdout
        try process.run()
        stdin.fileHandleForWriting.write(Data(input))
        try stdin.fileHandleForWriting.close()
        let output = stdout.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: output, as: UTF8.self))
    }

    /// `openssl …`, failing the test if it does not succeed.
    func openssl(_ arguments: [String], file: StaticString = #filePath, line: UInt = #line) throws {
        let result = try run("openssl", arguments)
        XCTAssertEqual(result.status, 0, "openssl \(arguments.joined(separator: " ")): \(result.output)", file: file, line: line)
    }

    /// A fresh private key from `openssl genpkey` (PKCS#8 PEM) and its public key; returns the key's path.
    func generateKey(_ name: String, for alg: JWSAlgorithm) throws -> String {
        let options: [String] = switch alg {
        case .ES256: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        case .ES384: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"]
        case .EdDSA: ["-algorithm", "ED25519"]
        case .RS256, .PS256: ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
        }
        try openssl(["genpkey"] + options + ["-out", path(name + ".pem")])
        try openssl(["pkey", "-in", path(name + ".pem"), "-pubout", "-out", path(name + ".pub")])
        return path(name + ".pem")
    }

    /// Whether `openssl` accepts `signature` (JWS form) over `message` with the public key `name`.pub.
    func opensslVerifies(_ name: String, alg: JWSAlgorithm, message: [UInt8], signature: [UInt8]) throws -> Bool {
        let messagePath = try write("message", message)
        switch alg {
        case .EdDSA:
            let signaturePath = try write("signature", signature)
            return try run("openssl", ["pkeyutl", "-verify", "-pubin", "-inkey", path(name + ".pub"), "-rawin",
                                       "-in", messagePath, "-sigfile", signaturePath]).status == 0
        case .ES256, .ES384:
            // openssl wants DER; the JWS form is r||s of fixed width.
            let signaturePath = try write("signature", DER.ecdsaSignature(raw: signature))
            return try run("openssl", ["dgst", alg == .ES256 ? "-sha256" : "-sha384", "-verify", path(name + ".pub"),
                                       "-signature", signaturePath, messagePath]).status == 0
        case .RS256:
            let signaturePath = try write("signature", signature)
            return try run("openssl", ["dgst", "-sha256", "-verify", path(name + ".pub"), "-signature", signaturePath, messagePath]).status == 0
        case .PS256:
            let signaturePath = try write("signature", signature)
            return try run("openssl", ["dgst", "-sha256", "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32",
                                       "-sigopt", "rsa_mgf1_md:sha256", "-verify", path(name + ".pub"),
                                       "-signature", signaturePath, messagePath]).status == 0
        }
    }
}

/// The DER form of an ECDSA signature, written here independently of the module under test.
enum DER {
    static func ecdsaSignature(raw: [UInt8]) -> [UInt8] {
        let half = raw.count / 2
        let body = integer(Array(raw[0..<half])) + integer(Array(raw[half...]))
        return [0x30] + length(body.count) + body
    }

    private static func integer(_ bigEndian: [UInt8]) -> [UInt8] {
        var value = Array(bigEndian.drop { $0 == 0 })
        if value.isEmpty { value = [0] }
        if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
        return [0x02] + length(value.count) + value
    }

    private static func length(_ count: Int) -> [UInt8] {
        count < 128 ? [UInt8(count)] : [0x81, UInt8(count)]
    }
}

func hex(_ text: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        let next = text.index(index, offsetBy: 2)
        bytes.append(UInt8(text[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

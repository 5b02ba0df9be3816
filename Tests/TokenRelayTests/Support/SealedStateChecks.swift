import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Helpers shared by the sealed-state tests (file and fleet): keys on disk, and the check that a stored
/// value holds no token in any readable spelling.
protocol SealedStateChecks {}

extension SealedStateChecks {
    /// A fresh 32-byte key written as `openssl rand -base64 32` writes it (base64 and a newline), mode 0600.
    func writeKey(_ directory: URL, _ name: String, raw: Bool = false) throws -> (url: URL, bytes: Data) {
        let bytes = Data((0..<32).map { _ in UInt8.random(in: 0...255) })  // the system CSPRNG
        let url = directory.appendingPathComponent(name)
        try (raw ? bytes : Data((bytes.base64EncodedString() + "\n").utf8)).write(to: url)
        XCTAssertEqual(chmod(url.path, 0o600), 0)
        return (url, bytes)
    }

    /// Every spelling a token or a key could leak in: as is, base64 (standard and url-safe, padded or
    /// not) and hex (either case).
    func spellings(of secret: Data) -> [String] {
        let base64 = secret.base64EncodedString()
        let url = base64.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        let hex = secret.map { String(format: "%02x", $0) }.joined()
        return [String(decoding: secret, as: UTF8.self), base64, base64.trimmingCharacters(in: ["="]), url,
                url.trimmingCharacters(in: ["="]), hex, hex.uppercased()].filter { $0.count >= 8 }
    }

    func assertHoldsNone(of secrets: [String], in stored: Data, _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        let text = String(decoding: stored, as: UTF8.self)
        for secret in secrets {
            for spelling in spellings(of: Data(secret.utf8)) {
                XCTAssertFalse(text.contains(spelling), "\(what) holds a token (\(spelling.prefix(6))…)", file: file, line: line)
            }
        }
    }

    func sealedEnvelope(_ stored: Data, file: StaticString = #filePath, line: UInt = #line) throws -> [String: Any] {
        let object = try XCTUnwrap(JSONSerialization.jsonObject(with: stored) as? [String: Any], file: file, line: line)
        XCTAssertEqual(Array(object.keys), ["sealed"], "a sealed state is the envelope alone", file: file, line: line)
        let envelope = try XCTUnwrap(object["sealed"] as? [String: Any], file: file, line: line)
        XCTAssertEqual(envelope["alg"] as? String, "A256GCM", file: file, line: line)
        XCTAssertEqual(envelope["version"] as? Int, 1, file: file, line: line)
        return envelope
    }

    /// The key id tokenrelay stores: the first 8 bytes of the key's SHA-256, in hex.
    /// Opens a sealed state independently of the product (python3-cryptography's AES-GCM): the format is
    /// what the README says, the associated data is the place's, and the whole document is inside.
    func openIndependently(_ stored: Data, key: Data, associatedData: String) throws -> [String: Any] {
        let script = """
        import base64, json, sys
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        envelope = json.load(open(sys.argv[1]))["sealed"]
        def b64(text): return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        plain = AESGCM(bytes.fromhex(sys.argv[2])).decrypt(b64(envelope["nonce"]), b64(envelope["ciphertext"]), sys.argv[3].encode())
        sys.stdout.write(plain.decode())
        """
        let directory = makeTemporaryDirectory(prefix: "tokenrelay-open")
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("sealed.json")
        try stored.write(to: input)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script, input.path, key.map { String(format: "%02x", $0) }.joined(), associatedData]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw TestSupportError("python3 could not open the sealed state") }
        return try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    /// Computed independently of the product (sha256sum).
    func keyID(_ key: Data) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(key)
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(String(decoding: data, as: UTF8.self).prefix(16))
    }
}

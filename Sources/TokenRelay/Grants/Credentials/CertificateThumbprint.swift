import FoundationEssentials
import JOSE

/// The `x5t#S256` of a PEM certificate (RFC 7515 §4.1.8): base64url of the SHA-256 of its DER bytes.
/// Read with the key, at start and on reload, off the loop.
enum CertificateThumbprint {
    static func sha256(pemFile path: String, field: String) throws -> String {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigError(field, "cannot read \(path)")
        }
        // The first certificate of the file (a chain starts with the client's own).
        let lines = String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).map { $0.trimmingWhitespace() }
        guard let begin = lines.firstIndex(of: "-----BEGIN CERTIFICATE-----"),
              let end = lines[begin...].firstIndex(of: "-----END CERTIFICATE-----"),
              let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()), !der.isEmpty else {
            throw ConfigError(field, "\(path) holds no PEM certificate")
        }
        return Base64URL.encode(Digest.sha256(Array(der)))
    }
}

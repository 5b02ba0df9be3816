import FoundationEssentials

/// The device authorization response (RFC 8628 §3.2): what the user is shown and what the poll presents.
struct DeviceAuthorization {
    /// Presented to the token endpoint; as good as a password until it expires, so never printed.
    let deviceCode: String
    let userCode: String
    let verificationURI: String
    let verificationURIComplete: String?
    /// Seconds the codes stay valid.
    let expiresIn: Double
    /// Seconds to wait between polls.
    let interval: Double

    /// RFC 8628 §3.2: poll every 5 s unless the server says otherwise.
    static let defaultInterval = 5.0

    /// Reads a 2xx answer. Numbers are accepted leniently: fractional seconds (tests rely on it), and
    /// numbers sent as strings, as some servers do for `expires_in`. `verification_url` is accepted for
    /// `verification_uri`, the name Google's endpoint used before the RFC.
    static func parse(_ body: [UInt8]) throws -> DeviceAuthorization {
        guard let json = (try? JSONReader.parse(body)) as? [String: Any] else {
            throw LoginError("the device authorization response is not a JSON object")
        }
        guard let deviceCode = json["device_code"] as? String, !deviceCode.isEmpty else {
            throw LoginError("the device authorization response has no device_code")
        }
        let userCode = try displayable(json["user_code"], "user_code")
        guard let verificationURI = try displayable(json["verification_uri"] ?? json["verification_url"], "verification_uri") else {
            throw LoginError("the device authorization response has no verification_uri")
        }
        guard let userCode else { throw LoginError("the device authorization response has no user_code") }
        guard let expiresIn = Timestamp.seconds(json["expires_in"]), expiresIn > 0 else {
            throw LoginError("the device authorization response has no usable expires_in")
        }
        // An interval of zero would poll in a tight loop; the default is the safe reading.
        let interval = Timestamp.seconds(json["interval"]).flatMap { $0 > 0 ? $0 : nil } ?? defaultInterval
        return DeviceAuthorization(deviceCode: deviceCode, userCode: userCode, verificationURI: verificationURI,
                                   verificationURIComplete: try displayable(json["verification_uri_complete"], "verification_uri_complete"),
                                   expiresIn: expiresIn, interval: interval)
    }

    /// These strings go to the operator's terminal, so a server (or someone in the middle of plain
    /// HTTP) must not be able to slip escape sequences or line breaks in with them.
    private static func displayable(_ value: Any?, _ field: String) throws -> String? {
        guard let value, !(value is JSONNull) else { return nil }
        guard let text = value as? String, !text.isEmpty,
              text.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F && !(0x80...0x9F).contains($0.value) }) else {
            throw LoginError("the device authorization response has an unusable \(field)")
        }
        return text
    }
}

/// Why `tokenrelay login` stopped: one line, never a code or a token.
public struct LoginError: Error, CustomStringConvertible {
    public let description: String
    init(_ reason: String) { description = "login: \(reason)" }
}

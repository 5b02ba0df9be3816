import JOSE

/// Signs DPoP proofs (RFC 9449 §4) with the one key the tokens are bound to: the driver asks it for the
/// `DPoP` header value of a request.
///
/// Cheap on purpose, because it runs on the loop for every proxied request: the header (`typ`, `alg`, the
/// public `jwk`) is encoded once; the start of the payload (`htm`, `htu`) is kept per (method, htu); `ath`
/// is computed once per access token. Per proof only `iat`, `jti`, `ath` and `nonce` are written, then one
/// base64url pass and one signature (ES256 ~18 µs, EdDSA ~25 µs). Confined to the event loop.
final class ProofSigner {
    let key: SigningKey
    let alg: JWSAlgorithm
    /// The OpenSSL context initialised once: each proof signs on a copy (bench: saves the per-call fetches).
    private let prepared: PreparedSigner
    /// base64url(header) and the dot after it: the start of every proof.
    private let headerSegment: [UInt8]
    /// `{"htm":"GET","htu":"https://api.example/v1/items"` per (method, htu).
    private var templates: [String: [UInt8]] = [:]
    /// Bounded: the htu comes from client paths, which must not grow this for ever.
    static let maxTemplates = 1024
    private var lastAth: (token: String, ath: [UInt8])?
    private(set) var proofsSigned = 0
    /// Told of every proof signed (the metrics counter).
    var onSigned: (() -> Void)?

    init(key: SigningKey, alg: JWSAlgorithm) throws {
        try key.check(alg)
        prepared = try PreparedSigner(key: key, alg: alg)
        self.key = key
        self.alg = alg
        let header = #"{"typ":"dpop+jwt","alg":"\#(alg.rawValue)","jwk":\#(key.publicJWK)}"#
        headerSegment = Array(Base64URL.encode(Array(header.utf8)).utf8) + [UInt8(ascii: ".")]
    }

    /// The key's RFC 7638 thumbprint (the tokens' `cnf.jkt`).
    var thumbprint: String { key.thumbprint }

    /// A fresh proof. `htu`: the target URL without query and fragment; `accessToken`: for `ath` (proxied
    /// requests; none on token requests); `nonce`: the server's latest, already validated (`DPoPNonce`).
    func proof(method: String, htu: String, accessToken: String?, nonce: String?, now: Double) throws -> String {
        // Built in two buffers kept from proof to proof (no allocation but the result): the payload, then
        // the compact JWS (header segment, base64url(payload), the signature) written into `jws`.
        payload.removeAll(keepingCapacity: true)
        appendTemplate(method: method, htu: htu)
        payload.append(contentsOf: Self.iatMember)
        Self.appendDigits(of: UInt64(clamping: Int64(exactly: now.rounded(.down)) ?? 0), radix: 10, to: &payload)
        payload.append(contentsOf: Self.jtiMember)
        payload.append(contentsOf: jtiPrefix)
        payload.append(UInt8(ascii: "."))
        jtiCounter &+= 1
        Self.appendDigits(of: jtiCounter, radix: 36, to: &payload)
        payload.append(UInt8(ascii: "\""))
        if let accessToken {
            payload.append(contentsOf: Self.athMember)
            payload.append(contentsOf: ath(accessToken))
            payload.append(UInt8(ascii: "\""))
        }
        if let nonce {
            // Validated: no quote, backslash or control byte, so it needs no escaping.
            payload.append(contentsOf: Self.nonceMember)
            payload.append(contentsOf: nonce.utf8)
            payload.append(UInt8(ascii: "\""))
        }
        payload.append(UInt8(ascii: "}"))
        jws.removeAll(keepingCapacity: true)
        jws.append(contentsOf: headerSegment)
        Base64URL.append(payload, to: &jws)
        let signature = try prepared.sign(jws)
        jws.append(UInt8(ascii: "."))
        Base64URL.append(signature, to: &jws)
        proofsSigned &+= 1
        onSigned?()
        return String(decoding: jws, as: UTF8.self)
    }

    private var payload: [UInt8] = []
    private var jws: [UInt8] = []
    private static let iatMember = Array(#","iat":"#.utf8)
    private static let jtiMember = Array(#","jti":""#.utf8)
    private static let athMember = Array(#","ath":""#.utf8)
    private static let nonceMember = Array(#","nonce":""#.utf8)

    /// `value` in `radix` (10 or 36), lower case, without a String in between.
    private static func appendDigits(of value: UInt64, radix: UInt64, to output: inout [UInt8]) {
        let start = output.count
        var rest = value
        repeat {
            let digit = UInt8(truncatingIfNeeded: rest % radix)
            output.append(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10)
            rest /= radix
        } while rest > 0
        output[start...].reverse()   // written least significant first
    }

    /// 96 random bits drawn once per signer (base64url, 16 characters), then a counter: unique per proof
    /// (RFC 9449 §4.2 asks for a negligible chance of reuse, not for secrecy), across restarts too (a new
    /// prefix each start), without a CSPRNG call — and OpenSSL's fork-check syscall — per request.
    private let jtiPrefix = Array(Base64URL.encode(SecureRandom.bytes(12)).utf8)
    private var jtiCounter: UInt64 = 0

    /// The last (method, htu) and its template: a client repeating one path finds it without building a key.
    private var lastTemplate: (method: String, htu: String, bytes: [UInt8])?

    private func appendTemplate(method: String, htu: String) {
        if let lastTemplate, lastTemplate.method == method, lastTemplate.htu == htu {
            payload.append(contentsOf: lastTemplate.bytes)
            return
        }
        let made = template(method: method, htu: htu)
        lastTemplate = (method, htu, made)
        payload.append(contentsOf: made)
    }

    private func template(method: String, htu: String) -> [UInt8] {
        let name = method + " " + htu
        if let made = templates[name] { return made }
        var made = Array(#"{"htm":"#.utf8)
        made.append(contentsOf: Self.jsonString(method))
        made.append(contentsOf: #","htu":"#.utf8)
        made.append(contentsOf: Self.jsonString(htu))
        if templates.count >= Self.maxTemplates { templates.removeAll(keepingCapacity: true) }
        templates[name] = made
        return made
    }

    /// base64url(SHA-256(token)), once per access token (every request under one token shares it).
    private func ath(_ token: String) -> [UInt8] {
        if let lastAth, lastAth.token == token { return lastAth.ath }
        let ath = Array(Base64URL.encode(Digest.sha256(Array(token.utf8))).utf8)
        lastAth = (token, ath)
        return ath
    }

    /// A JSON string literal: quote, backslash and control bytes escaped (a method or path is outside data).
    static func jsonString(_ text: String) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "\"")]
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\")); out.append(byte)
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out.append(contentsOf: Array(#"\u00"#.utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 15)]])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
        return out
    }

    /// `htu` for a target: `origin` (scheme://authority) and the path without query and fragment.
    static func htu(origin: String, target: some Collection<UInt8>) -> String {
        let path = target.prefix { $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") }
        return origin + String(decoding: path, as: UTF8.self)
    }
}

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
    private var lastAth: (token: String, ath: String)?
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
        var payload = template(method: method, htu: htu)
        payload.append(contentsOf: #","iat":"#.utf8)
        payload.append(contentsOf: String(Int64(clamping: Int64(exactly: now.rounded(.down)) ?? 0)).utf8)
        payload.append(contentsOf: #","jti":""#.utf8)
        appendJti(to: &payload)
        payload.append(UInt8(ascii: "\""))
        if let accessToken {
            payload.append(contentsOf: #","ath":""#.utf8)
            payload.append(contentsOf: ath(accessToken).utf8)
            payload.append(UInt8(ascii: "\""))
        }
        if let nonce {
            // Validated: no quote, backslash or control byte, so it needs no escaping.
            payload.append(contentsOf: #","nonce":""#.utf8)
            payload.append(contentsOf: nonce.utf8)
            payload.append(UInt8(ascii: "\""))
        }
        payload.append(UInt8(ascii: "}"))
        var signingInput = headerSegment
        signingInput.append(contentsOf: Base64URL.encode(payload).utf8)
        let signature = try prepared.sign(signingInput)
        signingInput.append(UInt8(ascii: "."))
        signingInput.append(contentsOf: Base64URL.encode(signature).utf8)
        proofsSigned &+= 1
        onSigned?()
        return String(decoding: signingInput, as: UTF8.self)
    }

    /// 96 random bits drawn once per signer (base64url, 16 characters), then a counter: unique per proof
    /// (RFC 9449 §4.2 asks for a negligible chance of reuse, not for secrecy), across restarts too (a new
    /// prefix each start), without a CSPRNG call — and OpenSSL's fork-check syscall — per request.
    private let jtiPrefix = Array(Base64URL.encode(SecureRandom.bytes(12)).utf8)
    private var jtiCounter: UInt64 = 0

    private func appendJti(to payload: inout [UInt8]) {
        payload.append(contentsOf: jtiPrefix)
        payload.append(UInt8(ascii: "."))
        jtiCounter &+= 1
        payload.append(contentsOf: String(jtiCounter, radix: 36).utf8)
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
    private func ath(_ token: String) -> String {
        if let lastAth, lastAth.token == token { return lastAth.ath }
        let ath = Base64URL.encode(Digest.sha256(Array(token.utf8)))
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

/// JWS compact serialisation (RFC 7515 §7.1): the caller serialises the header and payload JSON.
public enum JWS {
    /// header and payload are already-serialised JSON bytes; returns "b64(header).b64(payload).b64(sig)"
    public static func compact(headerJSON: [UInt8], payloadJSON: [UInt8], key: SigningKey, alg: JWSAlgorithm) throws -> String {
        let signingInput = Base64URL.encode(headerJSON) + "." + Base64URL.encode(payloadJSON)
        let signature = try key.sign(Array(signingInput.utf8), alg: alg)
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Reads a compact JWS/JWT WITHOUT verifying: the decoded payload JSON bytes (nil if not three
    /// base64url parts). For a token we only pass on (an assertion file's `exp`), never to trust.
    public static func unverifiedPayload(_ token: Substring) -> [UInt8]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty,
              Base64URL.decode(parts[0]) != nil, Base64URL.decode(parts[2]) != nil else { return nil }
        return Base64URL.decode(parts[1])
    }
}

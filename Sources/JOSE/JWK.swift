/// RFC 7638 §3.2 canonical public JWKs: the required members only, in lexicographic order, no whitespace
/// (base64url values never need JSON escaping). The thumbprint hashes exactly these bytes, so a verifier
/// that recomputes it from the `jwk` in a DPoP proof gets the same `jkt`.
enum JWK {
    static func rsa(n: String, e: String) -> String {
        #"{"e":"\#(e)","kty":"RSA","n":"\#(n)"}"#
    }

    static func ec(curve: String, x: String, y: String) -> String {
        #"{"crv":"\#(curve)","kty":"EC","x":"\#(x)","y":"\#(y)"}"#
    }

    static func okp(curve: String, x: String) -> String {
        #"{"crv":"\#(curve)","kty":"OKP","x":"\#(x)"}"#
    }

    static func thumbprint(_ canonicalJWK: String) -> String {
        Base64URL.encode(Digest.sha256(Array(canonicalJWK.utf8)))
    }
}

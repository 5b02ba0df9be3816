/// A `DPoP-Nonce` value a server sent (RFC 9449 §8.1: `nonce = 1*NQCHAR`, visible ASCII without `"` and `\`).
///
/// Outside data that goes back out in a signed proof: anything else is refused and never repeated, not in
/// the proof, not in a log line (the refusal names the cause, never the bytes). Because `"` and `\` are
/// refused, an accepted nonce can be written into the proof's JSON as it is, and CR/LF can never reach a
/// header.
enum DPoPNonce {
    /// Longer nonces are refused: a server that sends kilobytes would make every proof that long.
    static let maxBytes = 512

    enum Refusal: Error, Equatable, CustomStringConvertible {
        case empty, tooLong, badByte
        var description: String {
            switch self {
            case .empty: "the DPoP-Nonce is empty"
            case .tooLong: "the DPoP-Nonce is longer than \(DPoPNonce.maxBytes) bytes"
            case .badByte: "the DPoP-Nonce has a byte outside visible ASCII (or a quote or backslash)"
            }
        }
    }

    static func validated(_ bytes: some Collection<UInt8>) -> Result<String, Refusal> {
        if bytes.isEmpty { return .failure(.empty) }
        if bytes.count > maxBytes { return .failure(.tooLong) }
        for byte in bytes where !(byte == 0x21 || (0x23...0x5B).contains(byte) || (0x5D...0x7E).contains(byte)) {
            return .failure(.badByte)
        }
        return .success(String(decoding: bytes, as: UTF8.self))
    }
}

/// The latest nonce of each server (RFC 9449 §9: a nonce is used only with the server that issued it):
/// the token endpoint's and each upstream's apart. The latest `DPoP-Nonce` a server sent on any response
/// replaces the previous one. Confined to the event loop.
final class DPoPNonceStore {
    /// Servers kept at most (routes name a handful; a bound keeps outside data from growing it).
    static let maxServers = 256
    private var nonces: [String: String] = [:]

    /// `server`: the origin the nonce came from (`scheme://host:port`; the token endpoint's is prefixed "token endpoint ").
    func nonce(for server: String) -> String? { nonces[server] }

    /// Keeps `value` as `server`'s nonce; a refused value leaves the previous one and says why.
    @discardableResult
    func received(_ value: some Collection<UInt8>, from server: String) -> DPoPNonce.Refusal? {
        switch DPoPNonce.validated(value) {
        case .failure(let refusal): return refusal
        case .success(let nonce):
            if nonces[server] == nil && nonces.count >= Self.maxServers { nonces.removeAll(keepingCapacity: true) }
            nonces[server] = nonce
            return nil
        }
    }
}

import FoundationEssentials
import JOSE
import Logging

/// DPoP at run time, one per relay: the proof signer, the nonces each server sent, and the counting and
/// logging around them. The token endpoint's client and every proxied request ask it for a `DPoP` header
/// value. Confined to the event loop.
final class DPoPProofs {
    /// Replaced only by `adoptKey` (a key that arrived with adopted tokens), between two loop events.
    private(set) var signer: ProofSigner
    let nonces = DPoPNonceStore()
    private let metrics: RelayMetrics
    private let logger: Logger
    /// Refused nonces are logged once per server and cause until another is accepted: a server that
    /// sends a bad one on every response must not flood the log.
    private var loggedRefusals: Set<String> = []

    /// The generated key (PKCS#8 PEM) when it is kept with the token state (no `dpop.key_file`): every token
    /// set written carries it, so a state adopted without it (a `token import`) cannot lose it at the next
    /// write and, with it, the session bound to it at the next restart.
    private(set) var keptKeyPEM: String?
    /// Told the PEM of a key taken by `adoptKey` (fleet mode: the store's writes then put that one back).
    var onKeyAdopted: ((String) -> Void)?
    /// Proofs signed with keys this relay no longer signs with (`adoptKey`), for /status's running total.
    private var proofsSignedBefore = 0

    init(signer: ProofSigner, metrics: RelayMetrics, logger: Logger, keptKeyPEM: String? = nil) {
        self.signer = signer
        self.keptKeyPEM = keptKeyPEM
        self.metrics = metrics
        self.logger = logger
        use(signer)
    }

    private func use(_ signer: ProofSigner) {
        let signed = metrics.dpopProofsSigned
        signer.onSigned = { signed.increment() }
        metrics.recordDPoPKey(thumbprint: signer.thumbprint)
    }

    var thumbprint: String { signer.thumbprint }

    /// `tokens` with the kept key in it (unchanged when the key comes from `dpop.key_file`).
    func keepingItsKey(in tokens: TokenSet) -> TokenSet {
        guard let keptKeyPEM, tokens.otherFields[TokenSet.dpopKeyField] == nil else { return tokens }
        var kept = tokens
        kept.otherFields[TokenSet.dpopKeyField] = keptKeyPEM
        return kept
    }

    /// The scheme prefix of a DPoP-bound token's Authorization value.
    static let authorizationScheme = "DPoP "

    /// A proof for `method` on `htu` for `server` (its origin), with that server's latest nonce. nil when
    /// signing failed (logged; the request goes without a proof and the server says what it thinks).
    /// The last Authorization value a proxied request brought, and its token: every request under one token
    /// brings the same String, so `ath` (cached by the signer per token) is found without slicing it again.
    private var lastAuthorization: (value: String, token: String)?

    /// A proof for a proxied request: `target` as sent upstream (query and fragment dropped for `htu`),
    /// `authorization` the `DPoP <token>` value it carries.
    func proof(method: String, target: [UInt8], server: String, authorization: String) -> String? {
        let token: String
        if let lastAuthorization, lastAuthorization.value == authorization {
            token = lastAuthorization.token
        } else {
            token = String(authorization.utf8.dropFirst(Self.authorizationScheme.utf8.count))!
            lastAuthorization = (authorization, token)
        }
        return proof(method: method, htu: ProofSigner.htu(origin: server, target: target), server: server, accessToken: token)
    }

    func proof(method: String, htu: String, server: String, accessToken: String?) -> String? {
        do {
            return try signer.proof(method: method, htu: htu, accessToken: accessToken, nonce: nonces.nonce(for: server),
                                    now: Date().timeIntervalSince1970)
        } catch {
            logger.error("dpop: signing a proof failed: \(error)")
            return nil
        }
    }

    /// A `DPoP-Nonce` field from `server`: kept, or refused with one log line (the value never repeated).
    /// Returns whether it was accepted.
    @discardableResult
    func received(nonce value: some Collection<UInt8>, from server: String) -> Bool {
        guard let refusal = nonces.received(value, from: server) else {
            loggedRefusals.remove(server)
            return true
        }
        if loggedRefusals.insert(server).inserted {
            logger.warning("dpop: refused a DPoP-Nonce from \(server): \(refusal) (not used, not repeated)")
        }
        return false
    }

    private(set) var nonceReplays = 0

    func countNonceReplay() {
        nonceReplays &+= 1
        metrics.countDPoPNonceReplay()
    }

    /// `/status`'s part: on, the thumbprint (public), what was signed and resent. Never the key or a proof.
    var statusReport: [String: Any] {
        ["enabled": true, "alg": signer.alg.rawValue, "jkt": thumbprint, "proofs_signed": proofsSignedBefore &+ signer.proofsSigned,
         "nonce_replays": nonceReplays]
    }
}

extension DPoPProofs {
    /// Tokens adopted from the token state (`tokenrelay login`, `token import`, another process's write) that
    /// carry their own kept key and are bound to it, while this relay's key is one it keeps with the token state:
    /// the relay signs with the arriving key from now on. The adopted tokens replace the ones in service, so the
    /// key they are bound to is the only one that can present them.
    /// The race it settles: a relay started with a generated key it had not written yet (it is written with the
    /// first bound tokens) while `login` ran; the login found no key in the file, generated its own and wrote it
    /// with the tokens bound to it. Keeping ours would present those tokens with a key they are not bound to: the
    /// API refuses them and the refresh token is never presented ("bound to another key"), so the user is asked
    /// to log in again. Likewise in fleet mode, a set bound to another relay's key (one that started while the
    /// record had lost its key) brings that key along. `dpop.key_file` keys are never replaced: the file is the
    /// operator's choice. A key that is not the one the tokens are bound to is not taken.
    /// Called on the loop between the adoption and the requests it releases; the PEM is already in memory
    /// (parsed here once, tens of microseconds for EC and Ed25519 keys, no file or lock). Returns the line to
    /// log, nil when nothing changed.
    func adoptKey(arrivingWith adopted: TokenSet) -> String? {
        guard let ours = keptKeyPEM, let pem = adopted.otherFields[TokenSet.dpopKeyField] as? String, pem != ours,
              let bound = adopted.dpopBoundThumbprint, bound != signer.thumbprint else { return nil }
        let next: ProofSigner
        do {
            let key = try SigningKey.load(pem: Array(pem.utf8))
            guard key.thumbprint == bound else { return nil }
            next = try ProofSigner(key: key, alg: signer.alg)
        } catch {
            return "dpop: the adopted tokens carry a key this relay cannot sign \(signer.alg.rawValue) with (\(error)); keeping jkt \(signer.thumbprint)"
        }
        let line = "dpop: the adopted tokens are bound to the key kept with them (jkt \(bound)); signing with it instead of jkt \(signer.thumbprint)"
        proofsSignedBefore &+= signer.proofsSigned
        signer = next
        keptKeyPEM = pem
        use(next)
        onKeyAdopted?(pem)
        return line
    }
}

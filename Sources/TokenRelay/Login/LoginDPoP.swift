import FoundationEssentials
import HTTPTransport
import JOSE

/// `tokenrelay login` with `dpop`: the token requests (the device-code polls) carry proofs signed with the key
/// the relay will sign with, so the tokens the login obtains are bound to it (RFC 9449 §5). The device
/// authorization request carries none: RFC 9449 defines proofs for token requests (and resource requests);
/// a device authorization request is neither, and the device code it returns is not bound to a key.
struct LoginDPoP {
    let signer: ProofSigner
    let nonces = DPoPNonceStore()
    /// The key to write with the tokens when it is kept with the token state (no `dpop.key_file`).
    let keptKeyPEM: String?

    /// The key the relay uses: `dpop.key_file`; in fleet mode the one in the Redis record (stored now if the
    /// record has none, as a relay would); else the one kept in the token file, or a new one written with
    /// the tokens. `keptFields`: what the token file holds beside the tokens.
    static func load(_ config: Config, redis: DPoPFleetKey?, keptFields: [String: Any]) throws -> LoginDPoP? {
        guard let settings = config.dpop else { return nil }
        let key: SigningKey
        var kept: String?
        if settings.keyFile != nil {
            var none = TokenSet(accessToken: "")
            key = try DPoPKeySource.load(settings, tokens: &none, generate: false).key
        } else if let redis {
            let settled = try redis.settle(settings)
            (key, kept) = (settled.key, settled.pem)
        } else {
            var stored = TokenSet(accessToken: "", otherFields: keptFields)
            key = try DPoPKeySource.load(settings, tokens: &stored, generate: true).key
            kept = stored.otherFields[TokenSet.dpopKeyField] as? String
        }
        do {
            return LoginDPoP(signer: try ProofSigner(key: key, alg: settings.alg), keptKeyPEM: kept)
        } catch {
            throw ConfigError(settings.keyFile == nil ? "dpop.alg" : "dpop.key_file", "\(error)")
        }
    }

    /// Sends a token request with a proof; a `400 use_dpop_nonce` with a usable `DPoP-Nonce` is sent again at
    /// once (made anew: a client assertion's jti is good once) with a fresh proof carrying the nonce. The server
    /// refused it before looking at the device code, so this is not a second poll.
    func send(_ make: () throws -> TokenHTTPRequest, to client: BlockingHTTPClient, endpoint: HTTPEndpoint) throws -> Result<BlockingHTTPClient.Response, HTTPExchange.Failure> {
        let origin = "\(endpoint.scheme)://\(endpoint.authority)"
        var result = client.send(try signed(make(), endpoint: endpoint, origin: origin))
        if case .success(let response) = result, kept(response, origin: origin), Self.asksForNonce(response) {
            result = client.send(try signed(make(), endpoint: endpoint, origin: origin))
            if case .success(let again) = result { _ = kept(again, origin: origin) }
        }
        return result
    }

    /// Binds a grant to this key; a grant that is not DPoP-bound stays as it is (a Bearer answer works too).
    func bind(_ grant: inout TokenGrant) {
        if grant.proofBound { grant.boundKeyThumbprint = signer.thumbprint }
    }

    private func signed(_ request: TokenHTTPRequest, endpoint: HTTPEndpoint, origin: String) throws -> TokenHTTPRequest {
        var request = request
        let htu = ProofSigner.htu(origin: origin, target: Array(request.target.utf8))
        do {
            let proof = try signer.proof(method: request.method, htu: htu, accessToken: nil, nonce: nonces.nonce(for: origin),
                                         now: Date().timeIntervalSince1970)
            request.headers.append((name: "DPoP", value: proof))
        } catch {
            throw LoginError("dpop: signing a proof failed: \(error)")
        }
        return request
    }

    /// §8.2: the latest nonce on any answer is the one for the next request. A refused one is not used
    /// (and not repeated: the refusal names the cause only).
    private func kept(_ response: BlockingHTTPClient.Response, origin: String) -> Bool {
        guard let value = response.field("DPoP-Nonce") else { return false }
        return nonces.received(Array(value.utf8), from: origin) == nil
    }

    private static func asksForNonce(_ response: BlockingHTTPClient.Response) -> Bool {
        response.status == 400 && (TokenEndpointJSON.parse(response.body) as? [String: Any])?["error"] as? String == "use_dpop_nonce"
    }
}

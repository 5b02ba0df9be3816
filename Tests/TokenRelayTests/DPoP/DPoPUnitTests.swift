import Foundation
import JOSE
import Logging
import XCTest
@testable import TokenRelay

/// DPoP's pure parts in process: the request machine's nonce challenge, nonce validation and the per-server
/// store, the challenge rules, the proof signer's output (decoded and checked claim by claim), the config block.
final class DPoPUnitTests: XCTestCase {
    typealias Machine = RequestLifecycle
    private let settings = Machine.Settings(idempotent: true, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5)
    private let token1 = Machine.Admission.send(generation: 1, authorization: "DPoP one")
    private let token2 = Machine.Admission.send(generation: 2, authorization: "DPoP two")

    private func sent(_ machine: inout Machine, _ admission: Machine.Admission) {
        _ = machine.connectionAcquired(reused: true, admission: admission, now: 0)
    }

    // MARK: - The request machine

    /// A nonce challenge is read to its end and the request goes again at once: no refresh asked for.
    func testANonceChallengeIsResentOnceWithoutARefresh() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        XCTAssertEqual(machine.nonceChallenged(status: 401), [.cancel(.connect), .schedule(.responseHead, after: 30), .captureResponse])
        XCTAssertEqual(machine.responseEnded(now: 1), [.cancel(.responseHead), .releaseConnection, .resendWithFreshProof])
        XCTAssertEqual(machine.phase, .waitingForConnection)
        XCTAssertEqual(machine.connectionAcquired(reused: true, admission: token1, now: 1).first, .send(.token(generation: 1)))
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false).last, .relayResponse)
        let end = machine.responseEnded(now: 2)
        XCTAssertEqual(end.last, .finish)
        XCTAssertEqual(machine.summary?.attempts, 2)
        XCTAssertEqual(machine.nonceResends, 1)
    }

    /// The loop guard: a second nonce challenge for the same request is the client's answer.
    func testASecondNonceChallengeIsRelayed() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        _ = machine.nonceChallenged(status: 401)
        _ = machine.responseEnded(now: 1)
        sent(&machine, token1)
        XCTAssertEqual(machine.nonceChallenged(status: 401), [.cancel(.responseHead), .relayResponse])
        XCTAssertEqual(machine.responseEnded(now: 2).last, .finish)
        XCTAssertEqual(machine.summary?.status, 401)
    }

    /// The nonce resend does not use up the refresh rules' one chance: an expired token after it is refreshed.
    func testAnExpiredTokenAfterANonceResendStillRefreshes() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        _ = machine.nonceChallenged(status: 401)
        _ = machine.responseEnded(now: 1)
        sent(&machine, token1)
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .captureResponse)
        XCTAssertEqual(machine.responseEnded(now: 2).last, .consultRefreshRules(sentGeneration: 1))
        XCTAssertEqual(machine.refreshRulesDecided(.replay, now: 2).last, .acquireConnection(admittedEarlier: false))
        sent(&machine, token2)
        // The replay's own 401 is the client's: still one refresh-triggered replay at most.
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .relayResponse)
    }

    /// A replay after a refresh may still meet a nonce challenge (the server rotated it meanwhile): resent once.
    func testANonceChallengeToTheReplayAfterARefreshIsResent() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        _ = machine.responseHead(status: 401, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 1)
        _ = machine.refreshRulesDecided(.hold, now: 1)
        _ = machine.refreshFinished(.renewed(generation: 2), now: 2)
        sent(&machine, token2)
        XCTAssertEqual(machine.nonceChallenged(status: 401).last, .captureResponse)
        XCTAssertEqual(machine.responseEnded(now: 3).last, .resendWithFreshProof)
    }

    /// A streamed body that left cannot go again: the challenge is the client's.
    func testANonceChallengeAfterAStreamedBodyLeftIsRelayed() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        machine.streamedBodyStarted()
        XCTAssertEqual(machine.nonceChallenged(status: 401).last, .relayResponse)
    }

    /// A challenge whose body never ends: the connection is closed and the resend takes another.
    func testAStalledChallengeBodyStillResends() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        sent(&machine, token1)
        _ = machine.nonceChallenged(status: 401)
        XCTAssertEqual(machine.timerFired(.responseHead, now: 30), [.cancelUpstream, .resendWithFreshProof])
    }

    /// Passthrough requests carry no token and no proof: nothing to resend.
    func testAPassthroughRequestRelaysTheChallenge() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: nil, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: nil, now: 0)
        XCTAssertEqual(machine.nonceChallenged(status: 401).last, .relayResponse)
    }

    // MARK: - Challenges

    func testTheChallengeRulesKnowTheDPoPScheme() {
        let statuses: Set<Int> = [401]
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"DPoP error="invalid_token", algs="ES256""#], triggerStatuses: statuses))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"DPoP error="use_dpop_nonce""#], triggerStatuses: statuses))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"DPoP error="insufficient_scope""#], triggerStatuses: statuses))
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"DPoP algs="ES256""#], triggerStatuses: statuses))
        XCTAssertTrue(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"dpop error=use_dpop_nonce"#]))
        XCTAssertTrue(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"Bearer realm="x", DPoP error="use_dpop_nonce""#]))
        XCTAssertFalse(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"Bearer error="use_dpop_nonce""#]))
        XCTAssertFalse(RefreshTrigger.isNonceChallenge(status: 400, challenges: [#"DPoP error="use_dpop_nonce""#]))
        // Bearer's error is read up to the DPoP challenge, not from it.
        XCTAssertNil(RefreshTrigger.bearerError(in: [#"Bearer realm="api", DPoP error="use_dpop_nonce""#]))
        XCTAssertEqual(RefreshTrigger.bearerError(in: [#"Bearer error="invalid_token""#]), "invalid_token")
    }

    /// A scheme's name inside a quoted value (a realm, a description) is text, not the start of a challenge: it
    /// neither ends the challenge it is in nor starts one (found by the DPoP probe: a nonce challenge whose
    /// realm said "bearer" was relayed to the client as a 401, and an error read from a description).
    func testChallengeRulesReadSchemesOnlyOutsideQuotedValues() {
        let statuses: Set<Int> = [401]
        XCTAssertTrue(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"DPoP realm="bearer-api", error="use_dpop_nonce""#]))
        XCTAssertTrue(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"DPoP error_description="Bearer tokens are refused", error="use_dpop_nonce""#]))
        XCTAssertEqual(RefreshTrigger.bearerError(in: [#"Bearer realm="dpop-and-bearer.example", error="invalid_token""#]), "invalid_token")
        XCTAssertFalse(RefreshTrigger.isNonceChallenge(status: 401, challenges: [#"Bearer error="invalid_token", error_description="see DPoP error=use_dpop_nonce""#]))
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer error="invalid_token", error_description="see DPoP error=use_dpop_nonce""#],
                                                           triggerStatuses: statuses))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer realm="a \"DPoP\" api", error="insufficient_scope""#],
                                                            triggerStatuses: statuses))
        // A name that merely contains a scheme's is another scheme; a token68 credential is no parameter.
        XCTAssertNil(RefreshTrigger.dpopError(in: [#"XDPoP error="use_dpop_nonce""#]))
        XCTAssertEqual(RefreshTrigger.dpopError(in: [#"Negotiate a87421000492aa874209af8bc028==, DPoP error=use_dpop_nonce"#]), "use_dpop_nonce")
        XCTAssertEqual(RefreshTrigger.dpopError(in: [#"Basic realm="x",DPoP   error = "use_dpop_nonce" , algs="ES256""#]), "use_dpop_nonce")
        // Unbalanced or odd input ends without a crash and without an error read from nowhere.
        for odd in [#"DPoP error=""#, #"DPoP error"#, #"DPoP ="#, #"""#, #"DPoP realm="unterminated, error="use_dpop_nonce"#, "=,=,", ""] {
            XCTAssertNil(RefreshTrigger.dpopError(in: [odd]), odd)
        }
    }

    // MARK: - Nonces

    func testNoncesAreValidatedAndNeverEchoed() {
        XCTAssertEqual(try? DPoPNonce.validated(Array("eyJ7S_zG.eyJH0-Z.HX4w-7v".utf8)).get(), "eyJ7S_zG.eyJH0-Z.HX4w-7v")
        XCTAssertEqual(DPoPNonce.validated([UInt8]()), .failure(.empty))
        XCTAssertEqual(DPoPNonce.validated([UInt8](repeating: 0x41, count: DPoPNonce.maxBytes + 1)), .failure(.tooLong))
        for bad in ["a\r\nX-Evil: 1", "x y", "caf\u{e9}", "a\"b", "a\\b", "a\tb", "\u{7f}"] {
            guard case .failure(let refusal) = DPoPNonce.validated(Array(bad.utf8)) else { return XCTFail("accepted \(bad.debugDescription)") }
            XCTAssertFalse(refusal.description.contains(bad))
        }
    }

    func testNoncesAreKeptPerServerAndTheLatestWins() {
        let store = DPoPNonceStore()
        store.received(Array("n1".utf8), from: "https://as.example:443")
        store.received(Array("u1".utf8), from: "http://api.example:80")
        store.received(Array("n2".utf8), from: "https://as.example:443")
        XCTAssertEqual(store.received(Array("bad\r\n".utf8), from: "https://as.example:443"), .badByte)
        XCTAssertEqual(store.nonce(for: "https://as.example:443"), "n2")
        XCTAssertEqual(store.nonce(for: "http://api.example:80"), "u1")
        XCTAssertNil(store.nonce(for: "http://other:80"))
        for index in 0..<(DPoPNonceStore.maxServers * 2) { store.received(Array("n".utf8), from: "http://h\(index):80") }
        XCTAssertNotNil(store.nonce(for: "http://h\(DPoPNonceStore.maxServers * 2 - 1):80"))
    }

    // MARK: - Proofs

    private func decode(_ proof: String) throws -> (header: [String: Any], claims: [String: Any], signingInput: String, signature: [UInt8]) {
        let parts = proof.split(separator: ".", omittingEmptySubsequences: false)
        XCTAssertEqual(parts.count, 3)
        let header = try XCTUnwrap(TokenEndpointJSON.parse(try XCTUnwrap(Base64URL.decode(parts[0]))) as? [String: Any])
        let claims = try XCTUnwrap(TokenEndpointJSON.parse(try XCTUnwrap(Base64URL.decode(parts[1]))) as? [String: Any])
        return (header, claims, "\(parts[0]).\(parts[1])", try XCTUnwrap(Base64URL.decode(parts[2])))
    }

    func testAProofCarriesTheClaimsAndAFreshJtiEachTime() throws {
        for alg in [JWSAlgorithm.ES256, .EdDSA] {
            let key = try SigningKey.generate(for: alg)
            let signer = try ProofSigner(key: key, alg: alg)
            var jtis = Set<String>()
            for index in 0..<50 {
                let proof = try signer.proof(method: "POST", htu: "https://api.example/v1/items", accessToken: index < 25 ? "tok-a" : "tok-b",
                                             nonce: index % 2 == 0 ? "n-\(index)" : nil, now: 1_700_000_000.7)
                let (header, claims, _, signature) = try decode(proof)
                XCTAssertEqual(header["typ"] as? String, "dpop+jwt")
                XCTAssertEqual(header["alg"] as? String, alg.rawValue)
                let jwk = try XCTUnwrap(header["jwk"] as? [String: Any])
                XCTAssertNil(jwk["d"], "the private part never goes out")
                XCTAssertEqual(claims["htm"] as? String, "POST")
                XCTAssertEqual(claims["htu"] as? String, "https://api.example/v1/items")
                XCTAssertEqual(Timestamp.seconds(claims["iat"] as Any), 1_700_000_000)
                let token = index < 25 ? "tok-a" : "tok-b"
                XCTAssertEqual(claims["ath"] as? String, Base64URL.encode(Digest.sha256(Array(token.utf8))))
                XCTAssertEqual(claims["nonce"] as? String, index % 2 == 0 ? "n-\(index)" : nil)
                XCTAssertTrue(jtis.insert(try XCTUnwrap(claims["jti"] as? String)).inserted)
                XCTAssertEqual(signature.count, alg == .ES256 ? 64 : 64)
            }
            XCTAssertEqual(signer.proofsSigned, 50)
        }
    }

    func testAProofForATokenRequestHasNoAth() throws {
        let signer = try ProofSigner(key: try SigningKey.generate(for: .ES256), alg: .ES256)
        let (_, claims, _, _) = try decode(try signer.proof(method: "POST", htu: "http://as/token", accessToken: nil, nonce: nil, now: 5))
        XCTAssertNil(claims["ath"])
        XCTAssertNil(claims["nonce"])
    }

    func testTheHtuDropsQueryAndFragmentAndOddBytesAreEscaped() throws {
        XCTAssertEqual(ProofSigner.htu(origin: "http://api:8080", target: Array("/a/b?x=1#f".utf8)), "http://api:8080/a/b")
        XCTAssertEqual(ProofSigner.htu(origin: "http://api:8080", target: Array("/a#f?x".utf8)), "http://api:8080/a")
        let signer = try ProofSigner(key: try SigningKey.generate(for: .ES256), alg: .ES256)
        let (_, claims, _, _) = try decode(try signer.proof(method: "GET", htu: "http://a/\"q\\", accessToken: nil, nonce: nil, now: 1))
        XCTAssertEqual(claims["htu"] as? String, "http://a/\"q\\")
    }

    /// RFC 3986 §6.2.2.1: a host is case-insensitive and normalised to lower case; a server that compares `htu`
    /// with its own URL as written (not every one normalises, RFC 9449 §4.3 only says SHOULD) refused the proofs
    /// for an upstream or token URL configured as `https://API.Example.com` (found by the DPoP probe). The path
    /// keeps its case (it is case-sensitive), and the Host field goes out as the htu says.
    func testAMixedCaseHostIsLowerCasedForTheHtuAndTheHostField() throws {
        let endpoint = try HTTPEndpoint.parse("https://API.Example.COM:443/Base", field: "upstream.url")
        XCTAssertEqual(endpoint.authority, "api.example.com")
        XCTAssertEqual(endpoint.path, "/Base")
        XCTAssertEqual(ProofSigner.htu(origin: "\(endpoint.scheme)://\(endpoint.authority)", target: Array("/Base/x?q=A".utf8)),
                       "https://api.example.com/Base/x")
        XCTAssertEqual(try HTTPEndpoint.parse("HTTP://[::1]:8080/T", field: "refresh.token_url").description, "http://[::1]:8080/T")
    }

    /// `adoptKey`: a relay whose key is kept with the token state takes the key that arrives with adopted tokens
    /// bound to it (they replace the ones in service); a `dpop.key_file` key and a key the tokens are not bound to
    /// are never taken.
    func testARelayAdoptsTheKeyArrivingWithTokensBoundToIt() throws {
        let ours = try SigningKey.generate(for: .ES256)
        let theirs = try SigningKey.generate(for: .ES256)
        let theirPEM = String(decoding: try theirs.privateKeyPEM(), as: UTF8.self)
        let make = { (kept: Bool) in
            DPoPProofs(signer: try ProofSigner(key: ours, alg: .ES256), metrics: RelayMetrics(), logger: Logger(label: "test"),
                       keptKeyPEM: kept ? String(decoding: try ours.privateKeyPEM(), as: UTF8.self) : nil)
        }
        let login = TokenSet(accessToken: "a", refreshToken: "r", otherFields: [TokenSet.dpopKeyField: theirPEM, TokenSet.dpopThumbprintField: theirs.thumbprint])

        let fromFile = try make(false)  // dpop.key_file: never replaced
        XCTAssertNil(fromFile.adoptKey(arrivingWith: login))
        XCTAssertEqual(fromFile.thumbprint, ours.thumbprint)

        let mismatched = try make(true)  // the key that came is not the one the tokens are bound to
        var wrongPair = login
        wrongPair.otherFields[TokenSet.dpopThumbprintField] = try SigningKey.generate(for: .ES256).thumbprint
        XCTAssertNil(mismatched.adoptKey(arrivingWith: wrongPair))
        XCTAssertEqual(mismatched.thumbprint, ours.thumbprint)
        XCTAssertNil(mismatched.adoptKey(arrivingWith: TokenSet(accessToken: "bearer")), "no key, not bound: nothing to adopt")

        let fresh = try make(true)
        var told: String?
        fresh.onKeyAdopted = { told = $0 }
        _ = try fresh.proof(method: "GET", htu: "https://api.example/x", server: "https://api.example", accessToken: "old")
        let line = try XCTUnwrap(fresh.adoptKey(arrivingWith: login))
        XCTAssertEqual(told, theirPEM, "fleet mode: the store's writes put back the adopted key")
        XCTAssertNil(fresh.adoptKey(arrivingWith: login), "the same set again: nothing to change")
        XCTAssertTrue(line.contains(theirs.thumbprint) && !line.contains("PRIVATE"), line)
        XCTAssertEqual(fresh.thumbprint, theirs.thumbprint)
        XCTAssertEqual(fresh.keptKeyPEM, theirPEM, "the next token set written carries the adopted key")
        XCTAssertEqual(fresh.statusReport["proofs_signed"] as? Int, 1, "the running total survives the change")
        let proof = try XCTUnwrap(fresh.proof(method: "GET", htu: "https://api.example/x", server: "https://api.example", accessToken: "a"))
        let header = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(XCTUnwrap(Base64URL.decode(proof.split(separator: ".")[0])))) as? [String: Any])
        let theirJWK = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(theirs.publicJWK.utf8)) as? [String: Any])
        XCTAssertEqual((header["jwk"] as? [String: Any])?["x"] as? String, try XCTUnwrap(theirJWK["x"] as? String), "proofs carry the adopted key")
        XCTAssertEqual(fresh.statusReport["proofs_signed"] as? Int, 2)
    }

    /// `login` writes its key with the tokens bound to it even when the file holds another key by then (a relay
    /// wrote its own generated key with tokens of its own while the user signed in): key and tokens belong together.
    func testALoginWritesItsKeyOverTheKeyTheFileHoldsNow() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dpop-login-file-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("tokens.json").path
        try Data(#"{"access_token":"relay-a","refresh_token":"relay-r","dpop_key":"RELAY-KEY","dpop_jkt":"relay-jkt","keep":"me"}"#.utf8)
            .write(to: URL(fileURLWithPath: path))
        var grant = TokenGrant(accessToken: "login-a", refreshToken: "login-r", expiresIn: 3600)
        grant.proofBound = true
        grant.boundKeyThumbprint = "login-jkt"
        try LoginTokenFile.write(grant, to: TokenFile(path: path), adding: [TokenSet.dpopKeyField: "LOGIN-KEY"])
        let written = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        XCTAssertEqual(written["dpop_key"] as? String, "LOGIN-KEY")
        XCTAssertEqual(written["dpop_jkt"] as? String, "login-jkt")
        XCTAssertEqual(written["refresh_token"] as? String, "login-r")
        XCTAssertEqual(written["keep"] as? String, "me", "fields tokenrelay does not interpret are kept")
    }

    func testAKeyOfTheWrongTypeForTheAlgIsRefused() throws {
        XCTAssertThrowsError(try ProofSigner(key: try SigningKey.generate(for: .EdDSA), alg: .ES256))
    }

    /// A key file of the wrong type for `alg` is a check error naming dpop.key_file (never the key bytes).
    func testAKeyFileOfTheWrongTypeNamesTheField() throws {
        let pem = try SigningKey.generate(for: .EdDSA).privateKeyPEM()
        let url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dpop-\(UUID().uuidString).pem")
        try Data(pem).write(to: url)
        defer { try? FileManager.default.removeItem(at: url) }
        var tokens = TokenSet(accessToken: "")
        XCTAssertThrowsError(try DPoPKeySource.load(DPoPSettings(alg: .ES256, keyFile: url.path), tokens: &tokens, generate: false)) { error in
            let text = "\(error)"
            XCTAssertTrue(text.hasPrefix("dpop.key_file"), text)
            XCTAssertTrue(text.contains("ES256 needs an EC P-256 key"), text)
            let body = String(decoding: pem, as: UTF8.self).split(separator: "\n")[1]
            XCTAssertFalse(text.contains(body.prefix(12)))
        }
        XCTAssertNoThrow(try DPoPKeySource.load(DPoPSettings(alg: .EdDSA, keyFile: url.path), tokens: &tokens, generate: false))
        // Without key_file, run generates one into the token state; tokens bound to another key say so in one line.
        let generated = try DPoPKeySource.load(DPoPSettings(), tokens: &tokens, generate: true)
        XCTAssertTrue(generated.generated)
        XCTAssertNotNil(tokens.otherFields[TokenSet.dpopKeyField] as? String)
        XCTAssertFalse(try DPoPKeySource.load(DPoPSettings(), tokens: &tokens, generate: true).generated, "the kept key is reused")
        tokens.otherFields[TokenSet.dpopThumbprintField] = "another-jkt"
        XCTAssertNotNil(DPoPKeySource.keyChange(tokens: tokens, key: generated.key))
        tokens.otherFields[TokenSet.dpopThumbprintField] = generated.key.thumbprint
        XCTAssertNil(DPoPKeySource.keyChange(tokens: tokens, key: generated.key))
    }

    // MARK: - Config

    private func config(_ dpop: String) -> String {
        #"{"listen":"127.0.0.1:0","upstream":{"url":"http://127.0.0.1:1"},"tokens":{"file":"/tmp/t.json"},"refresh":{"token_url":"http://127.0.0.1:2/token","client_id":"c","grant":"refresh_token","client_auth":"none"}\#(dpop)}"#
    }

    func testTheDPoPBlockIsRead() throws {
        XCTAssertNil(try ConfigLoader.parse(Data(config("").utf8)).dpop)
        XCTAssertEqual(try ConfigLoader.parse(Data(config(#","dpop":{}"#).utf8)).dpop, DPoPSettings())
        let read = try ConfigLoader.parse(Data(config(#","dpop":{"alg":"EdDSA","key_file":"/k.pem"}"#).utf8)).dpop
        XCTAssertEqual(read?.alg, .EdDSA)
        XCTAssertEqual(read?.keyFile, "/k.pem")
        XCTAssertThrowsError(try ConfigLoader.parse(Data(config(#","dpop":{"alg":"HS256"}"#).utf8))) { error in
            XCTAssertTrue("\(error)".contains("dpop.alg"), "\(error)")
        }
        XCTAssertThrowsError(try ConfigLoader.parse(Data(config(#","dpop":{"algo":"ES256"}"#).utf8))) { error in
            XCTAssertTrue("\(error)".contains("dpop.algo"), "\(error)")
        }
    }
}

import Foundation
import JOSE
import Synchronization
import XCTest
@testable import TokenRelay

/// The credential sources and the two grants without processes: what each puts into the form, how an
/// unusable file is reported, and that a request needing a signature is made off the loop.
final class CredentialUnitTests: XCTestCase {
    private var workDir: URL!

    override func setUpWithError() throws { workDir = makeTemporaryDirectory(prefix: "tokenrelay-credunit") }
    override func tearDownWithError() throws { if let workDir { try? FileManager.default.removeItem(at: workDir) } }

    private func settings(_ refresh: [String: Any], removing removed: [String] = []) throws -> Config.Refresh {
        var full: [String: Any] = ["grant": "client_credentials", "token_url": "https://idp.test/token", "client_id": "app"]
        full.merge(refresh) { _, new in new }
        for key in removed { full[key] = nil }
        let object: [String: Any] = ["listen": "127.0.0.1:1", "upstream": ["url": "http://a"], "tokens": ["file": "/t"], "refresh": full]
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object)).refresh
    }

    private func form(_ request: TokenHTTPRequest) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in String(decoding: request.body, as: UTF8.self).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? "" }
            fields[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        return fields
    }

    private func claims(_ jwt: String) throws -> [String: Any] {
        try XCTUnwrap(JSONSerialization.jsonObject(with: Data(XCTUnwrap(JWS.unverifiedPayload(Substring(jwt))))) as? [String: Any])
    }

    private func write(_ text: String, _ name: String = "file") throws -> URL {
        let url = workDir.appendingPathComponent(name)
        try Data(text.utf8).write(to: url)
        return url
    }

    /// A JWT with `payload` and a dummy signature: the file reader never verifies.
    private func jwt(_ payload: [String: Any]) throws -> String {
        let body = try JSONSerialization.data(withJSONObject: payload)
        return Base64URL.encode(Array(#"{"alg":"none"}"#.utf8)) + "." + Base64URL.encode(Array(body)) + ".c2ln"
    }

    func testCredentialFileReasons() throws {
        let field = "refresh.client_assertion_file"
        func reason(_ path: String) -> String? {
            do { _ = try CredentialFile.jwt(at: path, field: field); return nil } catch { return error.reason }
        }
        let absent = workDir.appendingPathComponent("absent").path
        XCTAssertEqual(reason(absent), "\(field): cannot read \(absent): No such file or directory")
        XCTAssertEqual(reason(try write("").path), "\(field): \(workDir.appendingPathComponent("file").path) is empty")
        XCTAssertEqual(reason(try write(" \n\r\n").path), "\(field): \(workDir.appendingPathComponent("file").path) is empty")
        XCTAssertTrue(reason(try write("abc.def").path)?.hasSuffix("does not hold a JWT") ?? false)
        // Caught half-written: the payload part cut short.
        let whole = try jwt(["sub": "s", "exp": 4_102_444_800])
        XCTAssertTrue(reason(try write(String(whole.prefix(30))).path)?.hasSuffix("does not hold a JWT") ?? false)
        XCTAssertEqual(reason(try write(try jwt(["exp": 1_000_000_000])).path),
                       "\(field): the JWT in \(workDir.appendingPathComponent("file").path) expired at 2001-09-09T01:46:40Z")
        XCTAssertEqual(try CredentialFile.jwt(at: try write(whole + "\n").path, field: field), whole, "a line end is not part of it")
        XCTAssertNil(reason(try write(try jwt(["sub": "no exp"])).path), "without exp there is nothing to check")
        XCTAssertTrue(reason(try write(String(repeating: "a", count: CredentialFile.maxBytes + 1)).path)?.hasSuffix("larger than 64 KiB") ?? false)
        // Secrets never reach the reason.
        let secretLooking = try write("secret-material-\(UUID().uuidString)")
        XCTAssertFalse(reason(secretLooking.path)?.contains("secret-material") ?? true)
    }

    func testPrivateKeyJWTForm() throws {
        let keyFile = try write(String(decoding: try SigningKey.generate(for: .ES256).privateKeyPEM(), as: UTF8.self), "key.pem")
        let refresh = try settings(["client_auth": "private_key_jwt", "client_key_file": keyFile.path, "client_key_id": "k1"])
        let grant = TokenGrants.make(refresh, clientSecret: nil, keys: try CredentialKeys.load(refresh))
        XCTAssertTrue(grant.blocksWhileMakingRequest, "signing is made off the loop")
        let first = try grant.makeRequest(current: TokenSet(accessToken: "")).get()
        let second = try grant.makeRequest(current: TokenSet(accessToken: "")).get()
        let fields = form(first)
        XCTAssertEqual(fields["grant_type"], "client_credentials")
        XCTAssertEqual(fields["client_id"], "app")
        XCTAssertEqual(fields["client_assertion_type"], "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        XCTAssertNil(fields["client_secret"])
        XCTAssertFalse(first.headers.contains { $0.name == "Authorization" })
        let claims = try claims(try XCTUnwrap(fields["client_assertion"]))
        XCTAssertEqual(claims["iss"] as? String, "app")
        XCTAssertEqual(claims["sub"] as? String, "app")
        XCTAssertEqual(claims["aud"] as? String, "https://idp.test/token", "the default audience is token_url as configured")
        let iat = try XCTUnwrap(claims["iat"] as? Int), exp = try XCTUnwrap(claims["exp"] as? Int)
        XCTAssertEqual(exp - iat, PrivateKeyJWTCredential.lifetimeSeconds)
        XCTAssertNotEqual(claims["jti"] as? String, try self.claims(try XCTUnwrap(form(second)["client_assertion"]))["jti"] as? String)
    }

    func testSecretAndCertificateMethodsNeverBlock() throws {
        let basic = TokenGrants.make(try settings(["client_auth": "client_secret_basic", "client_secret_env": "S"]), clientSecret: "s")
        XCTAssertFalse(basic.blocksWhileMakingRequest)
        let none = TokenGrants.make(try settings(["client_auth": "none"]), clientSecret: nil)
        XCTAssertFalse(none.blocksWhileMakingRequest)
        XCTAssertEqual(form(try none.makeRequest(current: TokenSet(accessToken: "")).get())["client_id"], "app")
    }

    func testJWTBearerAssertionClaims() throws {
        let keyFile = try write(String(decoding: try SigningKey.generate(for: .EdDSA).privateKeyPEM(), as: UTF8.self), "key.pem")
        let refresh = try settings(["grant": "jwt_bearer", "scope": "s1",
                                    "assertion": ["key_file": keyFile.path, "issuer": "sa@x", "subject": "user@x", "lifetime_seconds": 60,
                                                  "claims": ["scope": "https://api/read", "nested": ["a": 1]]]],
                                   removing: ["client_id"])
        let grant = TokenGrants.make(refresh, clientSecret: nil, keys: try CredentialKeys.load(refresh))
        let fields = form(try grant.makeRequest(current: TokenSet(accessToken: "")).get())
        XCTAssertEqual(fields["grant_type"], "urn:ietf:params:oauth:grant-type:jwt-bearer")
        XCTAssertEqual(fields["scope"], "s1")
        XCTAssertNil(fields["client_id"], "client_auth none without a client id sends none")
        let claims = try claims(try XCTUnwrap(fields["assertion"]))
        XCTAssertEqual(claims["iss"] as? String, "sa@x")
        XCTAssertEqual(claims["sub"] as? String, "user@x")
        XCTAssertEqual(claims["aud"] as? String, "https://idp.test/token")
        XCTAssertEqual(claims["scope"] as? String, "https://api/read")
        XCTAssertEqual((claims["nested"] as? [String: Any])?["a"] as? Int, 1)
        XCTAssertEqual((claims["exp"] as? Int ?? 0) - (claims["iat"] as? Int ?? 0), 60)
    }

    func testTokenExchangeFormAndOpaqueSubjectTokens() throws {
        let subject = try write("opaque-subject-token\n", "subject")
        let refresh = try settings(["grant": "token_exchange", "client_auth": "none", "subject_token_file": subject.path,
                                    "subject_token_type": "urn:ietf:params:oauth:token-type:access_token", "audience": "a", "resource": "r"])
        let grant = TokenGrants.make(refresh, clientSecret: nil)
        XCTAssertTrue(grant.blocksWhileMakingRequest, "the subject token file is read off the loop")
        let fields = form(try grant.makeRequest(current: TokenSet(accessToken: "")).get())
        XCTAssertEqual(fields["subject_token"], "opaque-subject-token", "a token that is not typed as a JWT is taken as it is")
        XCTAssertEqual(fields["subject_token_type"], "urn:ietf:params:oauth:token-type:access_token")
        XCTAssertEqual(fields["audience"], "a")
        XCTAssertEqual(fields["resource"], "r")
        XCTAssertNil(fields["actor_token"])

        try FileManager.default.removeItem(at: subject)
        guard case .failure(let failure) = grant.makeRequest(current: TokenSet(accessToken: "")) else { return XCTFail("made without a file") }
        XCTAssertTrue(failure.transient, "a missing subject token is transient, not login required")
    }

    /// A grant that blocks while making its request runs on a helper thread: the loop keeps firing timers
    /// meanwhile, and the exchange starts once the request is made.
    func testBlockingRequestIsMadeOffTheLoop() throws {
        let gate = Gate()
        let grant = GatedGrant(gate: gate)
        let loop = try EventLoop()
        let client = TokenEndpointClient(loop: loop, connection: TokenEndpointConnection(
            endpoint: try HTTPEndpoint.parse("http://127.0.0.1:9/token", field: "t"), tls: nil, timeoutSeconds: 1), grant: grant)
        var ticksWhileBlocked = 0
        var outcome: TokenEndpointResult?
        let ticker = LoopEvent.repeating(loop: loop) {
            if !gate.isOpen { ticksWhileBlocked += 1 }
            if ticksWhileBlocked == 5 { gate.open() }
        }
        ticker.schedule(after: 0.005)
        let deadline = LoopEvent(loop: loop) { _ in loop.stop() }
        deadline.schedule(after: 10)
        client.refresh(current: TokenSet(accessToken: "")) { result, _ in
            outcome = result
            loop.stop()
        }
        XCTAssertTrue(client.isBusy, "busy while the request is being made")
        loop.run()
        XCTAssertGreaterThanOrEqual(ticksWhileBlocked, 5, "the loop ran while the request was being made")
        guard case .transient(let reason, _)? = outcome else { return XCTFail("expected the made request's transient failure, got \(String(describing: outcome))") }
        XCTAssertEqual(reason, "gate opened")
        XCTAssertFalse(client.isBusy)
    }

    /// A request that cannot be made within refresh_seconds (a hung file read) fails the attempt, with
    /// nothing sent; the late result is dropped.
    func testRequestTooSlowToMakeFailsTransiently() throws {
        let gate = Gate()
        let loop = try EventLoop()
        let client = TokenEndpointClient(loop: loop, connection: TokenEndpointConnection(
            endpoint: try HTTPEndpoint.parse("http://127.0.0.1:9/token", field: "t"), tls: nil, timeoutSeconds: 0.2), grant: GatedGrant(gate: gate))
        var outcome: TokenEndpointResult?
        let deadline = LoopEvent(loop: loop) { _ in loop.stop() }
        deadline.schedule(after: 10)
        client.refresh(current: TokenSet(accessToken: "")) { result, _ in
            outcome = result
            loop.stop()
        }
        loop.run()
        guard case .transient(let reason, let outcomeUnknown)? = outcome else { return XCTFail("got \(String(describing: outcome))") }
        XCTAssertEqual(reason, "preparing the token request took longer than timeouts.refresh_seconds; nothing was sent")
        XCTAssertFalse(outcomeUnknown)
        XCTAssertFalse(client.isBusy, "the next attempt may start")
        // Let the helper thread end while its loop still exists (its late result is dropped).
        gate.open()
        let done = Gate()
        let cleanup = LoopEvent(loop: loop) { _ in done.open(); loop.stop() }
        cleanup.schedule(after: 0.2)
        loop.run()
        XCTAssertTrue(done.isOpen)
        XCTAssertFalse(client.isBusy)
    }
}

/// Blocks in makeRequest until the test opens the gate (bounded: 10 s), then reports a transient failure.
private final class Gate: Sendable {
    private let state = Mutex(false)
    var isOpen: Bool { state.withLock { $0 } }
    func open() { state.withLock { $0 = true } }
}

private struct GatedGrant: TokenGrantStrategy {
    let gate: Gate
    var needsRefreshToken: Bool { false }
    var blocksWhileMakingRequest: Bool { true }

    func makeRequest(for tokens: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest> {
        let deadline = Date().addingTimeInterval(10)
        while !gate.isOpen && Date() < deadline { usleep(1000) }
        return .failure(UnusableRequest(reason: "gate opened", transient: true))
    }

    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult { .transient(reason: "unused", outcomeUnknown: false) }
}

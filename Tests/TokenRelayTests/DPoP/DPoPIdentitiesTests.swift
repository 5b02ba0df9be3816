import Foundation
import XCTest

/// `identities.<name>.dpop`: a named identity gets DPoP of its own (its key kept with its token state, its
/// proofs and nonces), beside the top-level identity that stays bearer. The DPoP identity talks to the DPoP
/// token server and API (`DPoPServer`, every proof verified), the bearer one to the fake token server and API.
final class DPoPIdentitiesTests: ReloadTestCase, SealedStateChecks {
    private var dpopServer: DPoPServer!
    private var tokenFileD: URL { workDir.appendingPathComponent("tokens-d.json") }

    override func setUpWithError() throws {
        try super.setUpWithError()
        dpopServer = try DPoPServer(settings: ["refresh_token": "rt-seed", "token_nonce_every": 1, "api_nonce_every": 7], workDir: workDir)
        // An access token the API does not know: the first request's 401 (invalid_token) starts d's refresh.
        try writeTokenFile(at: tokenFileD, access: "not-yet-issued", refresh: "rt-seed")
    }

    override func tearDownWithError() throws {
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0, let dpopServer {
            print("--- dpop server stderr:\n\(dpopServer.stderrText.suffix(3000))\nstats: \((try? dpopServer.stats()) ?? [:])")
        }
        dpopServer?.stop()
        try super.tearDownWithError()
    }

    private var identities: [String: Any] {
        ["routes": [["name": "d", "match": ["path_prefix": "/d/", "strip_prefix": true], "upstream": ["url": dpopServer.apiURL], "identity": "d"]],
         "identities": ["d": [
            "tokens": ["file": tokenFileD.path, "watch_interval_seconds": 0.2],
            "refresh": ["grant": "refresh_token", "token_url": dpopServer.tokenURL, "client_id": "relay-client", "client_auth": "none",
                        "backoff_seconds": 0.05],
            "dpop": ["alg": "EdDSA"],
         ]]]
    }

    func testANamedIdentitySignsProofsWhileTheTopLevelStaysBearer() throws {
        let relay = try startRelay(identities)
        for index in 0..<12 {
            let path = index.isMultiple(of: 2) ? "/d/items/\(index)" : "/a/items/\(index)"
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: path, headers: [("DPoP", "client-own")]).status, 200, path)
        }
        let stats = try dpopServer.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "one refresh for d")
        XCTAssertEqual(stats["proof_failures"] as? [String], [], "d's proofs verified on both sides")
        XCTAssertEqual(stats["jti_reuse"] as? Int, 0)
        XCTAssertEqual(stats["api_ok"] as? Int, 6)
        let jkt = try XCTUnwrap((stats["jkts"] as? [String])?.first)

        // d's key and binding are kept with d's token state; the top level's file has none.
        let stored = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileD)) as? [String: Any])
        XCTAssertEqual(stored["dpop_jkt"] as? String, jkt)
        XCTAssertTrue((stored["dpop_key"] as? String)?.contains("PRIVATE KEY") ?? false)
        let topLevel = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        XCTAssertNil(topLevel["dpop_key"])

        // The bearer identity's API saw bearer tokens and no DPoP field (the client's own is dropped there too).
        let bearerRequests = api.requests.filter { $0.path.hasPrefix("/a/items/") }
        XCTAssertEqual(bearerRequests.count, 6)
        for request in bearerRequests {
            XCTAssertTrue(request.headers.contains { $0.0.lowercased() == "authorization" && $0.1.hasPrefix("Bearer ") })
            XCTAssertFalse(request.headers.contains { $0.0.lowercased() == "dpop" }, "a DPoP field reached the bearer API")
        }

        // /status and /metrics name DPoP per identity.
        let status = try XCTUnwrap(try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status").json())
        XCTAssertEqual((status["dpop"] as? [String: Any])?["enabled"] as? Bool, false, "the top level is bearer")
        let named = try XCTUnwrap((status["identities"] as? [String: Any])?["d"] as? [String: Any])
        XCTAssertEqual((named["dpop"] as? [String: Any])?["jkt"] as? String, jkt)
        XCTAssertEqual((named["dpop"] as? [String: Any])?["alg"] as? String, "EdDSA")
        let metrics = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_dpop_enabled{identity=\"d\"} 1"), metrics)
        XCTAssertTrue(metrics.contains("tokenrelay_dpop_enabled{identity=\"default\"} 0"), metrics)
        XCTAssertFalse((relay.stderrText + metrics).contains("rt-seed"))
    }

    func testAWrongKeyForTheIdentityIsACheckErrorNamingItsField() throws {
        let keyFile = try TestKeys.make(.p256, in: workDir)  // the wrong type for EdDSA
        var config = config(identities)
        var identitiesObject = config["identities"] as! [String: Any]
        var d = identitiesObject["d"] as! [String: Any]
        d["dpop"] = ["alg": "EdDSA", "key_file": keyFile.path]
        identitiesObject["d"] = d
        config["identities"] = identitiesObject
        let url = workDir.appendingPathComponent("check.json")
        try JSONSerialization.data(withJSONObject: config).write(to: url)
        let result = try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path], environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("identities.d.dpop.key_file"), result.stderr)
    }

    private func check(_ config: [String: Any]) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("check-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path], environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
    }

    /// `check` says when a generated key would be stored in clear (no key_file, no tokens.encryption), for the
    /// top level and for each identity, and says nothing when the key is a file or sealed.
    func testCheckWarnsWhenTheGeneratedKeyIsStoredInClear() throws {
        var clearTopLevel = config(identities)
        clearTopLevel["dpop"] = [String: Any]()
        var named = clearTopLevel["identities"] as! [String: Any]
        var d = named["d"] as! [String: Any]
        d["dpop"] = ["key_file": try TestKeys.make(.p256, in: workDir).path]
        named["d"] = d
        clearTopLevel["identities"] = named
        let first = try check(clearTopLevel)
        XCTAssertEqual(first.exitCode, 0, first.stderr)
        XCTAssertTrue(first.stdout.contains("; WARNING: dpop: the generated key is stored in clear with the token state"), first.stdout)
        XCTAssertFalse(first.stdout.contains("identities.d: dpop"), "d's key is a file: \(first.stdout)")

        var sealedTopLevel = config(identities)
        sealedTopLevel["dpop"] = [String: Any]()
        sealedTopLevel["tokens"] = ["file": tokenFileURL.path, "encryption": ["key_file": try writeKey(workDir, "state-key").url.path]]
        let second = try check(sealedTopLevel)
        XCTAssertEqual(second.exitCode, 0, second.stderr)
        XCTAssertTrue(second.stdout.contains("; WARNING: identities.d: dpop: the generated key is stored in clear"), second.stdout)
        XCTAssertFalse(second.stdout.contains("; WARNING: dpop:"), "the top level's key is sealed: \(second.stdout)")
    }

    /// An identity with `dpop` added by a reload: its key is made off the loop while the config is checked, and
    /// its requests carry proofs the server verifies; the running top level is untouched.
    func testAnIdentityWithDPoPAddedByAReloadSignsProofs() throws {
        // Started with a bearer identity `e` already (a relay started without identities cannot add the first
        // one by a reload yet: its metrics were registered without the identity label).
        let tokenFileE = workDir.appendingPathComponent("tokens-e.json")
        try FileManager.default.copyItem(at: tokenFileURL, to: tokenFileE)
        let bearerIdentity: [String: Any] = ["tokens": ["file": tokenFileE.path], "refresh": config()["refresh"]!]
        let relay = try startRelay(["identities": ["e": bearerIdentity]])
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/a/0").status, 200)
        var next = identities
        var named = next["identities"] as! [String: Any]
        named["e"] = bearerIdentity
        next["identities"] = named
        try reload(relay, next)
        XCTAssertTrue(relay.stderrText.contains("identity added by a config reload"), relay.stderrText)
        for index in 0..<4 {
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/d/items/\(index)").status, 200)
        }
        let stats = try dpopServer.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1)
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
        let stored = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileD)) as? [String: Any])
        XCTAssertEqual(stored["dpop_jkt"] as? String, (stats["jkts"] as? [String])?.first)
    }
}

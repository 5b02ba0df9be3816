import Foundation
import XCTest
@testable import TokenRelay

final class ConfigLoaderTests: XCTestCase {
    private let valid: [String: Any] = [
        "listen": "127.0.0.1:8080",
        "upstream": ["url": "http://127.0.0.1:9000"],
        "tokens": ["file": "/var/lib/tokenrelay/tokens.json"],
        "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "legacy-app",
                    "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
        "admin": ["listen": "127.0.0.1:8081"],
    ]

    private func parse(_ object: [String: Any]) throws -> Config {
        try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func error(_ object: [String: Any]) -> ConfigError? {
        do {
            _ = try parse(object)
            return nil
        } catch let error as ConfigError {
            return error
        } catch {
            XCTFail("unexpected error \(error)")
            return nil
        }
    }

    private func with(_ path: [String], _ value: Any?) -> [String: Any] {
        func set(_ object: [String: Any], _ path: ArraySlice<String>) -> [String: Any] {
            var copy = object
            let key = path.first!
            if path.count == 1 {
                copy[key] = value
            } else {
                copy[key] = set(copy[key] as? [String: Any] ?? [:], path.dropFirst())
            }
            return copy
        }
        return set(valid, path[...])
    }

    func testIssueExampleParses() throws {
        let config = try parse(valid)
        XCTAssertEqual(config.listen.port, 8080)
        XCTAssertEqual(config.upstream.url.authority, "127.0.0.1:9000")
        XCTAssertEqual(config.refresh.tokenURL.requestTarget, "/oauth/token")
        XCTAssertEqual(config.refresh.clientAuth, .clientSecretBasic)
        XCTAssertEqual(config.refresh.clientSecret, .environment("TOKENRELAY_CLIENT_SECRET"))
        XCTAssertEqual(config.admin?.listen.port, 8081)
        XCTAssertEqual(config.limits.maxBodyBytes, 8 * 1024 * 1024)
    }

    func testUnknownKeyNamesItsPath() {
        XCTAssertEqual(error(with(["refresh", "clinet_id"], "x"))?.description, "refresh.clinet_id: unknown key (did you mean client_id?)")
        XCTAssertEqual(error(with(["listn"], "x"))?.description, "listn: unknown key (did you mean listen?)")
        XCTAssertEqual(error(with(["timeouts", "hold"], 3))?.description, "timeouts.hold: unknown key")
    }

    func testMissingAndMistypedFieldsNameTheField() {
        XCTAssertEqual(error(with(["refresh", "client_id"], nil))?.description, "refresh.client_id: is required")
        XCTAssertEqual(error(with(["upstream"], nil))?.description,
                       "upstream: is required unless routes has a route (then a request matching no route gets 404)")
        XCTAssertEqual(error(with(["listen"], 8080))?.description, "listen: must be a string")
        XCTAssertEqual(error(with(["listen"], "localhost"))?.field, "listen")
        XCTAssertEqual(error(with(["listen"], "127.0.0.1:99999"))?.field, "listen")
        XCTAssertEqual(error(with(["upstream", "url"], "ftp://x"))?.field, "upstream.url")
        XCTAssertEqual(error(with(["limits", "max_body_bytes"], -1))?.field, "limits.max_body_bytes")
        XCTAssertEqual(error(with(["limits", "max_held_requests"], true))?.description, "limits.max_held_requests: must be a number")
        XCTAssertEqual(error(with(["timeouts", "hold_seconds"], "30"))?.description, "timeouts.hold_seconds: must be a number")
    }

    /// The wait for `100 Continue` before a streamed upload's body goes anyway.
    func testContinueWaitDefaultsToOneSecondAndIsChecked() throws {
        XCTAssertEqual(try parse(valid).timeouts.continueSeconds, 1)
        XCTAssertEqual(try parse(with(["timeouts", "continue_seconds"], 0.25)).timeouts.continueSeconds, 0.25)
        XCTAssertEqual(error(with(["timeouts", "continue_seconds"], 0))?.field, "timeouts.continue_seconds")
        XCTAssertEqual(error(with(["timeouts", "continue_seconds"], "1"))?.description, "timeouts.continue_seconds: must be a number")
    }

    /// `refresh.trigger_grpc_statuses`: 16 (UNAUTHENTICATED) always, like 401 for `trigger_statuses`; gRPC's
    /// codes only; a named identity reads its own from its refresh block.
    func testGRPCTriggerStatusesDefaultTo16AndAreChecked() throws {
        XCTAssertEqual(try parse(valid).refresh.triggerGRPCStatuses, [16])
        XCTAssertEqual(try parse(with(["refresh", "trigger_grpc_statuses"], [7])).refresh.triggerGRPCStatuses, [7, 16])
        XCTAssertEqual(try parse(with(["refresh", "trigger_grpc_statuses"], [])).refresh.triggerGRPCStatuses, [16])
        XCTAssertEqual(error(with(["refresh", "trigger_grpc_statuses"], [17]))?.description,
                       "refresh.trigger_grpc_statuses[0]: must be a whole number between 1 and 16")
        XCTAssertEqual(error(with(["refresh", "trigger_grpc_statuses"], [16, 0.5]))?.field, "refresh.trigger_grpc_statuses[1]")
        XCTAssertEqual(error(with(["refresh", "trigger_grpc_statuses"], "16"))?.description, "refresh.trigger_grpc_statuses: must be an array of numbers")
        var refresh = valid["refresh"] as! [String: Any]
        refresh["trigger_grpc_statuses"] = [14]
        var object = valid
        object["identities"] = ["hr": ["tokens": ["file": "/var/lib/tokenrelay/hr.json"], "refresh": refresh]]
        var identityRefresh = refresh
        identityRefresh["trigger_grpc_statuses"] = [99]
        let config = try parse(object)
        XCTAssertEqual(config.identities.first?.refresh.triggerGRPCStatuses, [14, 16])
        object["identities"] = ["hr": ["tokens": ["file": "/var/lib/tokenrelay/hr.json"], "refresh": identityRefresh]]
        XCTAssertEqual(error(object)?.field, "identities.hr.refresh.trigger_grpc_statuses[0]")
    }

    func testClientAuthIsExplicitAndConsistentWithTheSecret() {
        XCTAssertEqual(error(with(["refresh", "client_auth"], nil))?.field, "refresh.client_auth")
        XCTAssertEqual(error(with(["refresh", "client_auth"], "basic"))?.field, "refresh.client_auth")
        let both = with(["refresh", "client_secret_file"], "/run/secret")
        XCTAssertEqual(error(both)?.field, "refresh.client_secret_file")
        XCTAssertEqual(error(with(["refresh", "client_secret_env"], nil))?.field, "refresh.client_secret_env")
        XCTAssertEqual(error(with(["refresh", "client_auth"], "none"))?.field, "refresh.client_auth")
        var publicClient = with(["refresh", "client_auth"], "none")
        publicClient["refresh"] = (publicClient["refresh"] as! [String: Any]).filter { $0.key != "client_secret_env" }
        XCTAssertNil(error(publicClient))
    }

    func testMalformedJSONSaysSo() {
        XCTAssertThrowsError(try ConfigLoader.parse(Data("{\"listen\": ".utf8))) { error in
            XCTAssertTrue("\(error)".contains("not valid JSON"), "\(error)")
        }
    }

    func testAdminListenerMustNotCollideWithTheProxyListener() {
        XCTAssertEqual(error(with(["admin", "listen"], "127.0.0.1:8080"))?.field, "admin.listen")
        XCTAssertTrue(error(with(["admin", "listen"], "127.0.0.1:8080"))?.reason.hasPrefix("must differ from listen") ?? false)
        var wildcard = with(["admin", "listen"], "127.0.0.1:8080")
        wildcard["listen"] = "[::]:8080"
        XCTAssertEqual(error(wildcard)?.field, "admin.listen", "the IPv6 wildcard also takes IPv4 addresses")
        wildcard["listen"] = "0.0.0.0:8080"
        XCTAssertEqual(error(wildcard)?.field, "admin.listen")
        var v6 = with(["admin", "listen"], "[0:0::1]:8080")
        v6["listen"] = "[::1]:8080"
        XCTAssertEqual(error(v6)?.field, "admin.listen", "two spellings of one address")
        var apart = with(["admin", "listen"], "[::1]:8080")
        apart["listen"] = "0.0.0.0:8080"
        XCTAssertNil(error(apart), "0.0.0.0 does not take IPv6 addresses")
        var portZero = with(["admin", "listen"], "127.0.0.1:0")
        portZero["listen"] = "127.0.0.1:0"
        XCTAssertNil(error(portZero), "port 0 picks a different free port for each")
        XCTAssertNil(error(with(["admin", "listen"], "127.0.0.2:8080")))
    }

    func testUnsupportedGrantIsRejected() {
        XCTAssertEqual(error(with(["refresh", "grant"], "password"))?.field, "refresh.grant")
    }

    func testHTTPSURLsDefaultToPort443AndTLSDefaults() throws {
        let config = try parse(with(["upstream", "url"], "https://api.example.com/v1"))
        XCTAssertTrue(config.upstream.url.usesTLS)
        XCTAssertEqual(config.upstream.url.port, 443)
        XCTAssertEqual(config.upstream.url.authority, "api.example.com")
        XCTAssertNil(config.upstream.tls)
        XCTAssertFalse(config.refresh.tokenURL.usesTLS)
    }

    func testTLSObjectIsReadForBothTargets() throws {
        var object = with(["upstream"], ["url": "https://api.example.com", "tls": [
            "ca_file": "/etc/ca.pem", "server_name": "api.internal", "client_cert": "/c.pem", "client_key": "/c.key",
            "insecure_skip_verify": true,
        ]])
        var refresh = object["refresh"] as! [String: Any]
        refresh["token_url"] = "https://auth.example.com/token"
        refresh["tls"] = ["ca_file": "/etc/auth-ca.pem"]
        object["refresh"] = refresh
        let config = try parse(object)
        let tls = try XCTUnwrap(config.upstream.tls)
        XCTAssertEqual(tls.caFile, "/etc/ca.pem")
        XCTAssertEqual(tls.serverName, "api.internal")
        XCTAssertEqual(tls.clientCert, "/c.pem")
        XCTAssertEqual(tls.clientKey, "/c.key")
        XCTAssertTrue(tls.insecureSkipVerify)
        XCTAssertEqual(config.refresh.tls?.caFile, "/etc/auth-ca.pem")
        XCTAssertEqual(config.refresh.tls?.insecureSkipVerify, false)
    }

    func testTLSErrorsNameTheField() {
        let https = with(["upstream", "url"], "https://api.example.com")
        func upstreamTLS(_ tls: Any) -> [String: Any] {
            var object = https
            object["upstream"] = ["url": "https://api.example.com", "tls": tls]
            return object
        }
        XCTAssertEqual(error(upstreamTLS(["ca_fle": "/x"]))?.description, "upstream.tls.ca_fle: unknown key (did you mean ca_file?)")
        XCTAssertEqual(error(upstreamTLS(["client_cert": "/c.pem"]))?.field, "upstream.tls.client_key")
        XCTAssertEqual(error(upstreamTLS(["client_key": "/c.key"]))?.field, "upstream.tls.client_cert")
        XCTAssertEqual(error(upstreamTLS(["insecure_skip_verify": "yes"]))?.description, "upstream.tls.insecure_skip_verify: must be true or false")
        XCTAssertEqual(error(upstreamTLS("strict"))?.description, "upstream.tls: must be a JSON object")
        XCTAssertEqual(error(with(["upstream", "tls"], ["ca_file": "/x"]))?.description, "upstream.tls: is only allowed with an https:// URL")
        XCTAssertEqual(error(with(["refresh", "tls"], [String: Any]()))?.field, "refresh.tls")
    }
}

/// What Foundation's lenient parser lets through and the config must not: checks on the text itself,
/// which the schema agreement cases (built with JSONSerialization) cannot produce.
final class StrictJSONTests: XCTestCase {
    private func violation(_ text: String) -> StrictJSON.Violation? {
        XCTAssertNotNil(try? JSONSerialization.jsonObject(with: Data(text.utf8)), "the parser accepts it: \(text)")
        return StrictJSON.firstViolation(in: Data(text.utf8))
    }

    func testWellFormedDocumentsPass() {
        for text in [#"{}"#, #"[]"#, #"{"a":[],"b":{},"c":[{}]}"#, #"{"a":"x,}","b":"\"}","c":"\\"}"#, #"[1,-2.5e3,true,false,null,"s"]"#,
                     #"{"a":{"k":1},"b":{"k":2}}"#, #"[{"k":1},{"k":2}]"#, "\u{FEFF}{\"a\": 1}", "{ \"a\" : [ 1 , 2 ] , \"b\" : { } }\n"] {
            XCTAssertNil(violation(text), text)
        }
    }

    func testTrailingCommasNameTheirLine() {
        XCTAssertEqual(violation("{\"a\": 1,\n}"), .init(kind: .trailingComma, line: 1))
        XCTAssertEqual(violation("{\n\"a\": [1,\n2,\n]\n}"), .init(kind: .trailingComma, line: 3))
        XCTAssertEqual(violation("{\"a\": 1,\n}")?.description, "trailing comma at line 1")
    }

    func testDuplicateKeysNameTheirPath() {
        XCTAssertEqual(violation("{\"listen\": 1,\n\"listen\": 2}"), .init(kind: .duplicateKey(path: "listen"), line: 2))
        XCTAssertEqual(violation(#"{"refresh":{"client_id":"a","client_id":"b"}}"#)?.kind, .duplicateKey(path: "refresh.client_id"))
        XCTAssertEqual(violation(#"{"p":[{"x":1},{"x":1,"x":2}]}"#)?.kind, .duplicateKey(path: "p[1].x"))
        XCTAssertEqual(violation(#"{"listen":1,"list\u0065n":2}"#)?.kind, .duplicateKey(path: "listen"), "escapes spell the same key")
        XCTAssertEqual(violation(#"{"a\nb":1,"a\nb":2}"#)?.description, #"duplicate key a\nb at line 1"#, "one line")
    }

    func testConfigLoaderRefusesBoth() {
        XCTAssertThrowsError(try ConfigLoader.parse(Data("{\"listen\": \"127.0.0.1:8080\",\n}".utf8))) { error in
            XCTAssertEqual("\(error)", "config is not valid JSON: trailing comma at line 1")
        }
        XCTAssertThrowsError(try ConfigLoader.parse(Data("{\"listen\": \"127.0.0.1:8080\",\n\"listen\": \"127.0.0.1:9\"}".utf8))) { error in
            XCTAssertEqual(error as? ConfigError, ConfigError("listen", "duplicate key at line 2"))
        }
    }
}

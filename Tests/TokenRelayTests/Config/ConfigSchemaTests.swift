import Foundation
import XCTest

/// config/tokenrelay.schema.json and `tokenrelay check` must agree: an editor that accepts a config while
/// `check` rejects it (or the other way round) is worse than no schema. Each case runs through both, with a
/// real private token file and the client secret set, so only the config itself can make either fail.
final class ConfigSchemaTests: XCTestCase {
    private var workDir: URL!
    private var tokenFile: URL { workDir.appendingPathComponent("tokens.json") }
    private var secretFile: URL { workDir.appendingPathComponent("client_secret") }
    private var keyFile: URL { workDir.appendingPathComponent("client_key.pem") }
    private var stateKeyFile: URL { workDir.appendingPathComponent("token_state_key") }
    private let secretEnvironment = ["TOKENRELAY_CLIENT_SECRET": "schema-test-secret", "TOKENRELAY_REDIS_PASSWORD": "schema-test-redis"]

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-schema")
        try writeTokenFile(at: tokenFile, access: "access-1", refresh: "refresh-1")
        try Data("schema-test-secret\n".utf8).write(to: secretFile)
        guard chmod(secretFile.path, 0o600) == 0 else { throw TestSupportError(errnoContext: "chmod") }
        try FileManager.default.moveItem(at: try TestKeys.make(.p256, in: workDir), to: keyFile)
        try Data((Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString() + "\n").utf8).write(to: stateKeyFile)
    }

    override func tearDownWithError() throws {
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    private func baseConfig() -> [String: Any] {
        [
            "listen": "127.0.0.1:8080",
            "upstream": ["url": "http://127.0.0.1:9000"],
            "tokens": ["file": tokenFile.path],
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
            "admin": ["listen": "127.0.0.1:8081"],
        ]
    }

    private struct Case {
        let name: String
        let edits: [(path: String, value: Any?)] // nil removes the key
        /// nil: valid. Otherwise a text that `check`'s one-line error must contain (normally the field path).
        let error: String?
    }

    private static func valid(_ name: String, _ edits: [(String, Any?)]) -> Case { Case(name: name, edits: edits, error: nil) }
    private static func invalid(_ name: String, _ edits: [(String, Any?)], _ error: String) -> Case {
        Case(name: name, edits: edits, error: error)
    }

    private var cases: [Case] {
        [
            Self.valid("minimal with env secret and basic auth", []),
            Self.valid("secret file, post auth, every optional key", [
                ("refresh.client_secret_env", nil), ("refresh.client_secret_file", secretFile.path),
                ("refresh.client_auth", "client_secret_post"), ("refresh.scope", "api.read"),
                ("refresh.max_attempts", 20), ("refresh.backoff_seconds", 0.01), ("tokens.watch_interval_seconds", 3600),
                ("limits", ["max_body_bytes": 0, "max_header_bytes": 1024, "max_held_requests": 1, "max_client_connections": 1, "max_upstream_connections": 100_000,
                            "max_upstream_waiters": 0]),
                ("timeouts", ["upstream_seconds": 0.05, "refresh_seconds": 86_400, "hold_seconds": 30, "drain_seconds": 0,
                              "client_seconds": 60, "connect_seconds": 0.05, "stream_idle_seconds": 86_400, "pool_idle_seconds": 1,
                              "pool_wait_seconds": 0.05, "continue_seconds": 0.05]),
                ("log", ["level": "critical"]),
            ]),
            Self.valid("public client without secret", [("refresh.client_secret_env", nil), ("refresh.client_auth", "none")]),
            Self.valid("no admin listener, port 0, IPv6 host", [("admin", nil), ("listen", "[::1]:0")]),
            Self.valid("whole number written as 3.0", [("refresh.max_attempts", 3.0)]),
            Self.valid("fleet: redis without a file", [("tokens.file", nil), ("tokens.redis", ["url": "redis://127.0.0.1:6379/2", "key": "tokenrelay:app"])]),
            Self.valid("fleet: redis with a cache file and every key", [("tokens.redis", [
                "url": "redis://[::1]:6380", "key": "tokenrelay:app", "username": "relay", "password_env": "TOKENRELAY_REDIS_PASSWORD",
                "command_timeout_seconds": 0.5, "lock_seconds": 70, "poll_interval_seconds": 1])]),
            Self.valid("fleet: unix socket", [("tokens.file", nil), ("tokens.redis", ["url": "unix:///run/redis/redis.sock", "key": "k"])]),
            Self.invalid("fleet: password in the URL", [("tokens.redis", ["url": "redis://user:pw@127.0.0.1:6379/0", "key": "k"])],
                         "tokens.redis.url: must not carry credentials"),
            Self.valid("fleet: rediss with the default TLS settings", [("tokens.redis", ["url": "rediss://127.0.0.1:6380/0", "key": "k"])]),
            Self.valid("fleet: rediss with a tls block", [("tokens.redis", ["url": "rediss://redis.internal:6380/1", "key": "k",
                                                                             "tls": ["server_name": "redis.example.com", "insecure_skip_verify": true]])]),
            Self.invalid("fleet: tls with redis://", [("tokens.redis", ["url": "redis://127.0.0.1:6379/0", "key": "k", "tls": ["insecure_skip_verify": true]])],
                         "tokens.redis.tls: is only allowed with a rediss:// URL"),
            Self.invalid("fleet: unknown key in tls", [("tokens.redis", ["url": "rediss://127.0.0.1", "key": "k", "tls": ["ca": "/x"]])],
                         "tokens.redis.tls.ca: unknown key"),
            Self.invalid("fleet: client_cert without client_key", [("tokens.redis", ["url": "rediss://127.0.0.1", "key": "k",
                                                                                     "tls": ["client_cert": "/x.pem"]])],
                         "tokens.redis.tls.client_key: is required"),
            Self.invalid("fleet: not a redis URL", [("tokens.redis", ["url": "http://127.0.0.1:6379", "key": "k"])], "tokens.redis.url: must be a redis://"),
            Self.invalid("fleet: key missing", [("tokens.redis", ["url": "redis://127.0.0.1"])], "tokens.redis.key: is required"),
            Self.invalid("fleet: key with a space", [("tokens.redis", ["url": "redis://127.0.0.1", "key": "a b"])], "tokens.redis.key"),
            Self.invalid("fleet: unknown key", [("tokens.redis", ["url": "redis://127.0.0.1", "key": "k", "pasword_env": "X"])],
                         "tokens.redis.pasword_env: unknown key"),
            Self.invalid("fleet: both password sources", [("tokens.redis", ["url": "redis://127.0.0.1", "key": "k", "password_env": "TOKENRELAY_REDIS_PASSWORD",
                                                                           "password_file": "/x"])], "tokens.redis.password_file: set either"),
            Self.invalid("unknown key at the root", [("listn", "127.0.0.1:8080")], "listn: unknown key"),
            Self.invalid("unknown key in refresh", [("refresh.clinet_id", "typo")], "refresh.clinet_id: unknown key"),
            Self.invalid("unknown key in limits", [("limits", ["max_body": 1])], "limits.max_body: unknown key"),
            Self.invalid("unknown key in admin", [("admin.port", 8081)], "admin.port: unknown key"),
            Self.invalid("missing required section", [("upstream", nil)], "upstream: is required"),
            Self.invalid("missing required key", [("tokens.file", nil)], "tokens.file: is required"),
            Self.invalid("listen is a number", [("listen", 8080)], "listen: must be a string"),
            Self.invalid("section is a string", [("upstream", "http://127.0.0.1:9000")], "upstream: must be a JSON object"),
            Self.invalid("number given as string", [("tokens.watch_interval_seconds", "1")], "tokens.watch_interval_seconds: must be a number"),
            Self.invalid("boolean is not a number", [("refresh.max_attempts", true)], "refresh.max_attempts: must be a number"),
            Self.invalid("empty client id", [("refresh.client_id", "")], "refresh.client_id: must not be empty"),
            Self.invalid("max_attempts below range", [("refresh.max_attempts", 0)], "refresh.max_attempts: must be between 1 and 20"),
            Self.invalid("max_header_bytes below range", [("limits", ["max_header_bytes": 512])], "limits.max_header_bytes"),
            Self.invalid("drain_seconds above range", [("timeouts", ["drain_seconds": 3601])], "timeouts.drain_seconds"),
            Self.invalid("no client connections", [("limits", ["max_client_connections": 0])], "limits.max_client_connections: must be between 1 and"),
            Self.invalid("fractional integer", [("limits", ["max_held_requests": 1.5])], "limits.max_held_requests: must be a whole number"),
            Self.invalid("port out of range", [("admin.listen", "127.0.0.1:70000")], "admin.listen: port must be a number"),
            Self.invalid("listen without port", [("listen", "127.0.0.1")], "listen: must be host:port"),
            Self.invalid("tls on an http upstream", [("upstream.tls", ["server_name": "api.internal"])], "upstream.tls: is only allowed with an https:// URL"),
            Self.invalid("client_cert without client_key", [("upstream.url", "https://api.example.com"), ("upstream.tls", ["client_cert": "/c.pem"])],
                         "upstream.tls.client_key: is required"),
            Self.invalid("trigger status out of range", [("refresh.trigger_statuses", [200])], "refresh.trigger_statuses[0]"),
            Self.invalid("gRPC trigger status out of range", [("refresh.trigger_grpc_statuses", [0])], "refresh.trigger_grpc_statuses[0]"),
            Self.invalid("gRPC trigger status not a list", [("refresh.trigger_grpc_statuses", 16)], "refresh.trigger_grpc_statuses: must be an array"),
            Self.valid("gRPC trigger statuses", [("refresh.trigger_grpc_statuses", [16, 7])]),
            Self.invalid("passthrough prefix without slash", [("upstream.passthrough_prefixes", ["auth"])], "upstream.passthrough_prefixes[0]: must start with /"),
            Self.valid("https targets and refresh lifecycle keys", [
                ("upstream.url", "https://api.example.com:8443/v1"), ("upstream.tls", ["server_name": "api.internal", "insecure_skip_verify": false]),
                ("upstream.passthrough_prefixes", ["/auth/", "/login"]), ("refresh.trigger_statuses", [401, 419, 440]),
                ("refresh.proactive", true), ("refresh.skew_seconds", 30), ("refresh.storm_max_refreshes", 5), ("refresh.storm_window_seconds", 30),
            ]),
            Self.valid("token in a custom header", [("inject", ["header": "accessToken", "format": "{token}"])]),
            Self.invalid("inject header not a token", [("inject.header", "access token")], "inject.header: must be an HTTP header name"),
            Self.invalid("inject header reserved", [("inject.header", "Content-Length")], "inject.header: Content-Length is set by tokenrelay"),
            Self.invalid("inject format without placeholder", [("inject.format", "Bearer")], "inject.format: must contain {token} exactly once"),
            Self.invalid("inject format with two placeholders", [("inject.format", "{token}{token}")], "inject.format: must contain {token}"),
            Self.invalid("inject format with CR LF", [("inject.format", "Bearer {token}\r\nX-Evil: 1")], "inject.format: must not contain control"),
            Self.invalid("unknown key in inject", [("inject.prefix", "Bearer")], "inject.prefix: unknown key"),
            Self.valid("client_credentials with scope, audience and resource", [
                ("refresh.grant", "client_credentials"), ("refresh.scope", "api.read"), ("refresh.audience", "https://api.example"),
                ("refresh.resource", "https://api.example/v1"),
            ]),
            Self.invalid("audience with refresh_token", [("refresh.audience", "x")], "refresh.audience: is only used by the client_credentials and token_exchange grants"),
            Self.invalid("request with refresh_token", [("refresh.request", ["url": "http://127.0.0.1:9001/auth"])], "refresh.request: is only used by the custom grant"),
            Self.valid("custom seed-style grant", customGrant([])),
            Self.valid("custom grant with form body, GET-less method and expires_at", customGrant([
                ("refresh.request.method", "PUT"), ("refresh.request.body_json", nil),
                ("refresh.request.body_form", ["token": "{{refresh_token}}", "id": "{{ client_id }}"]),
                ("refresh.response.expires_in", nil), ("refresh.response.expires_at", "/data/expires~1at"),
                ("refresh.response.login_required_statuses", [401]),
            ])),
            Self.invalid("custom with token_url", customGrant([("refresh.token_url", "http://127.0.0.1:9001/t")]),
                         "refresh.token_url: is not used by the custom grant"),
            Self.invalid("custom with client_auth", customGrant([("refresh.client_auth", "none")]), "refresh.client_auth: is not used by the custom grant"),
            Self.invalid("custom without response", customGrant([("refresh.response", nil)]), "refresh.response: is required"),
            Self.invalid("custom unknown placeholder", customGrant([("refresh.request.headers", ["X-Refresh-Token": "{{refresh}}"])]),
                         "refresh.request.headers.X-Refresh-Token: unknown placeholder {{refresh}}"),
            Self.invalid("custom unterminated placeholder", customGrant([("refresh.request.headers", ["X-Refresh-Token": "{{refresh_token"])]),
                         "refresh.request.headers.X-Refresh-Token: has {{ without a closing }}"),
            Self.invalid("custom header with CR LF", customGrant([("refresh.request.headers", ["X-A": "a\r\nX-B: b"])]),
                         "refresh.request.headers.X-A: must not contain control characters"),
            Self.invalid("custom reserved header", customGrant([("refresh.request.headers", ["Content-Length": "1"])]),
                         "refresh.request.headers.Content-Length: is set by tokenrelay"),
            Self.invalid("custom pointer without slash", customGrant([("refresh.response.access_token", "data/accessToken")]),
                         "refresh.response.access_token: is not a JSON Pointer"),
            Self.invalid("custom pointer with bad escape", customGrant([("refresh.response.refresh_token", "/data/~2")]),
                         "refresh.response.refresh_token: is not a JSON Pointer"),
            Self.invalid("custom with both bodies", customGrant([("refresh.request.body_form", ["a": "b"])]),
                         "refresh.request.body_form: set either body_json or body_form"),
            Self.invalid("custom with both expiries", customGrant([("refresh.response.expires_at", "/data/at")]),
                         "refresh.response.expires_at: set either expires_in or expires_at"),
            Self.invalid("custom placeholder in URL", customGrant([("refresh.request.url", "http://127.0.0.1:9001/auth?t={{refresh_token}}")]),
                         "refresh.request.url: placeholders are not allowed"),
            Self.invalid("custom bad method", customGrant([("refresh.request.method", "DELETE")]), "refresh.request.method: must be one of"),
            Self.invalid("custom unknown request key", customGrant([("refresh.request.body", "x")]), "refresh.request.body: unknown key"),
            Self.valid("forwarding headers switched off", [("forwarding", ["x_forwarded_for": false, "x_forwarded_proto": false, "via": false])]),
            Self.invalid("unknown key in forwarding", [("forwarding", ["x_forwarded_host": true])], "forwarding.x_forwarded_host: unknown key"),
            Self.invalid("forwarding flag as string", [("forwarding", ["via": "yes"])], "forwarding.via: must be"),
            Self.invalid("connect_seconds below range", [("timeouts", ["connect_seconds": 0])], "timeouts.connect_seconds"),
            Self.invalid("unknown timeout", [("timeouts", ["header_seconds": 5])], "timeouts.header_seconds: unknown key"),
            Self.invalid("negative waiters", [("limits", ["max_upstream_waiters": -1])], "limits.max_upstream_waiters"),
            Self.valid("login with the refresh defaults", [("login", ["device_authorization_url": "https://auth.example.com/oauth/device/code"])]),
            Self.valid("login with every key", [("login", ["device_authorization_url": "http://127.0.0.1:9001/device",
                                                           "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "device-app",
                                                           "scope": "openid offline_access"])]),
            Self.invalid("login unknown key", [("login", ["device_authorization_url": "http://127.0.0.1:9001/device", "interval": 5])],
                         "login.interval: unknown key"),
            Self.invalid("login without device_authorization_url", [("login", ["client_id": "device-app"])],
                         "login.device_authorization_url: is required"),
            Self.invalid("login with a non-http URL", [("login", ["device_authorization_url": "ftp://127.0.0.1/device"])],
                         "login.device_authorization_url: must be an http:// or https:// URL"),
            Self.invalid("login empty client_id", [("login", ["device_authorization_url": "http://127.0.0.1:9001/device", "client_id": ""])],
                         "login.client_id: must not be empty"),
            Self.invalid("login with client_credentials", [("refresh.grant", "client_credentials"),
                                                           ("login", ["device_authorization_url": "http://127.0.0.1:9001/device"])],
                         "login: is only used with refresh.grant refresh_token"),
            Self.invalid("login with the custom grant", customGrant([("login", ["device_authorization_url": "http://127.0.0.1:9001/device"])]),
                         "login: is only used with refresh.grant refresh_token"),
            Self.invalid("URL with credentials", [("refresh.token_url", "http://user:pw@127.0.0.1:9001/t")], "refresh.token_url"),
            Self.invalid("bad log level", [("log", ["level": "verbose"])], "log.level: must be one of"),
            Self.invalid("bad client_auth", [("refresh.client_auth", "client_secret_jwt")], "refresh.client_auth: must be one of"),
            Self.invalid("unsupported grant", [("refresh.grant", "password")], "refresh.grant: unsupported grant"),
            Self.invalid("both secret sources", [("refresh.client_secret_file", secretFile.path)], "set either client_secret_env or client_secret_file"),
            Self.invalid("basic auth without secret", [("refresh.client_secret_env", nil)], "needs client_secret_env or client_secret_file"),
            Self.invalid("none with secret", [("refresh.client_auth", "none")], "refresh.client_auth: is none, so no client secret"),
            Self.invalid("none with secret file", [("refresh.client_auth", "none"), ("refresh.client_secret_env", nil),
                                                   ("refresh.client_secret_file", secretFile.path)], "refresh.client_auth: is none"),
        ] + credentialCases
    }

    /// private_key_jwt, tls_client_auth, jwt_bearer and token_exchange (issue 20).
    private var credentialCases: [Case] {
        let keyJWT: [(String, Any?)] = [("refresh.client_auth", "private_key_jwt"), ("refresh.client_secret_env", nil)]
        return [
            Self.valid("private_key_jwt with every signing option", keyJWT + [
                ("refresh.client_key_file", keyFile.path), ("refresh.client_key_id", "k1"), ("refresh.client_assertion_alg", "ES256"),
                ("refresh.client_assertion_audience", "https://idp.example/")]),
            Self.valid("private_key_jwt with an assertion file", keyJWT + [("refresh.client_assertion_file", "/var/run/secrets/token")]),
            Self.invalid("private_key_jwt without a key", keyJWT, "refresh.client_key_file: client_auth private_key_jwt needs"),
            Self.invalid("private_key_jwt with both", keyJWT + [("refresh.client_key_file", keyFile.path), ("refresh.client_assertion_file", "/t")],
                         "refresh.client_assertion_file: set either"),
            Self.invalid("private_key_jwt with a secret", keyJWT + [("refresh.client_secret_env", "TOKENRELAY_CLIENT_SECRET"),
                                                                    ("refresh.client_key_file", keyFile.path)],
                         "refresh.client_auth: is private_key_jwt, so no client secret"),
            Self.invalid("kid with an assertion file", keyJWT + [("refresh.client_assertion_file", "/t"), ("refresh.client_key_id", "k1")],
                         "refresh.client_key_id: only applies"),
            Self.invalid("key file with basic auth", [("refresh.client_key_file", keyFile.path)],
                         "refresh.client_key_file: is only used with client_auth private_key_jwt"),
            Self.invalid("bad assertion alg", keyJWT + [("refresh.client_key_file", keyFile.path), ("refresh.client_assertion_alg", "HS256")],
                         "refresh.client_assertion_alg: must be one of"),
            Self.invalid("tls_client_auth without a certificate", [("refresh.client_auth", "tls_client_auth"), ("refresh.client_secret_env", nil),
                                                                  ("refresh.token_url", "https://127.0.0.1:9001/oauth/token")],
                         "refresh.tls.client_cert: is required by client_auth tls_client_auth"),
            Self.valid("jwt_bearer signed, no client auth", [
                ("refresh.grant", "jwt_bearer"), ("refresh.client_auth", nil), ("refresh.client_id", nil), ("refresh.client_secret_env", nil),
                ("refresh.scope", "api"),
                ("refresh.assertion", ["key_file": keyFile.path, "issuer": "sa@example", "subject": "sa@example", "lifetime_seconds": 600,
                                       "claims": ["scope": "api"]])]),
            Self.valid("jwt_bearer from a file", [("refresh.grant", "jwt_bearer"), ("refresh.client_auth", nil), ("refresh.client_secret_env", nil),
                                                  ("refresh.assertion", ["file": "/var/run/secrets/token"])]),
            Self.invalid("jwt_bearer without an assertion", [("refresh.grant", "jwt_bearer"), ("refresh.client_auth", nil),
                                                            ("refresh.client_secret_env", nil)], "refresh.assertion: is required"),
            Self.invalid("jwt_bearer owned claim", [("refresh.grant", "jwt_bearer"), ("refresh.client_auth", nil), ("refresh.client_secret_env", nil),
                                                    ("refresh.assertion", ["key_file": keyFile.path, "issuer": "i", "subject": "s", "claims": ["exp": 1]])],
                         "refresh.assertion.claims.exp: is set by tokenrelay"),
            Self.invalid("assertion on client_credentials", [("refresh.grant", "client_credentials"), ("refresh.assertion", ["file": "/t"])],
                         "refresh.assertion: is only used by the jwt_bearer grant"),
            Self.valid("token_exchange with every key", [
                ("refresh.grant", "token_exchange"), ("refresh.subject_token_file", "/var/run/secrets/token"),
                ("refresh.subject_token_type", "urn:ietf:params:oauth:token-type:jwt"), ("refresh.actor_token_file", "/a"),
                ("refresh.actor_token_type", "urn:ietf:params:oauth:token-type:jwt"), ("refresh.audience", "api"), ("refresh.resource", "https://api/"),
                ("refresh.scope", "read"), ("refresh.requested_token_type", "urn:ietf:params:oauth:token-type:access_token")]),
            Self.invalid("token_exchange without a subject token", [("refresh.grant", "token_exchange")], "refresh.subject_token_file: is required"),
            Self.invalid("actor type without actor", [("refresh.grant", "token_exchange"), ("refresh.subject_token_file", "/s"),
                                                     ("refresh.actor_token_type", "urn:x")], "refresh.actor_token_type: needs actor_token_file"),
            Self.invalid("subject token on refresh_token", [("refresh.subject_token_file", "/s")],
                         "refresh.subject_token_file: is only used by the token_exchange grant"),
            Self.valid("routes and identities", [
                ("routes", [["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": "https://hr.internal"], "identity": "hr"],
                            ["name": "pay", "listen": "127.0.0.1:8091", "upstream": ["url": "http://pay.internal/v2"], "inject": ["header": "X-Token"]]]),
                ("identities", ["hr": ["tokens": ["file": "/var/lib/tokenrelay/hr.json"],
                                       "refresh": ["grant": "client_credentials", "token_url": "https://idp/token", "client_id": "hr",
                                                   "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_post"]]]),
            ]),
            Self.valid("routes only, no top-level upstream", [
                ("upstream", nil),
                ("routes", [["name": "pay", "listen": "127.0.0.1:8091", "upstream": ["url": "http://pay.internal/v2"], "max_held_requests": 5,
                             "inject": ["header": "X-Api-Token", "format": "Token {token}"]]]),
            ]),
            Self.invalid("no upstream and no route", [("upstream", nil), ("routes", [Any]())], "upstream: is required"),
            Self.invalid("route max_held_requests 0", [("routes", [["name": "a", "match": ["host": "a"], "upstream": ["url": "http://a"],
                                                                     "max_held_requests": 0]])], "routes[0].max_held_requests:"),
            Self.invalid("route with listen and match", [("routes", [["name": "a", "listen": "127.0.0.1:8091", "match": ["host": "a"],
                                                                       "upstream": ["url": "http://a"]]])], "routes[0].match:"),
            Self.invalid("strip_prefix without path_prefix", [("routes", [["name": "a", "match": ["host": "a", "strip_prefix": true],
                                                                            "upstream": ["url": "http://a"]]])], "routes[0].match.strip_prefix:"),
            Self.invalid("identity without refresh", [("identities", ["a": ["tokens": ["file": "/a.json"]]])], "identities.a.refresh: is required"),
            Self.valid("identities only, no top-level identity", identitiesOnly([])),
            Self.invalid("no top-level identity, a route naming none", identitiesOnly([
                ("routes", [["name": "hr", "match": ["path_prefix": "/hr/"], "upstream": ["url": "https://hr.internal"], "identity": "hr"],
                            ["name": "docs", "match": ["host": "docs"], "upstream": ["url": "http://docs.internal"]]])]), "routes[1].identity:"),
            Self.invalid("top-level upstream without tokens", identitiesOnly([("upstream", ["url": "http://127.0.0.1:9000"])]), "upstream:"),
            Self.invalid("no tokens and no identities", [("tokens", nil)], "tokens: is required"),
            // tokens.encryption (issue 20, sealing)
            Self.valid("sealed token state", [("tokens.encryption", ["key_file": stateKeyFile.path, "previous_key_files": [stateKeyFile.path]])]),
            Self.invalid("sealing with two key sources", [("tokens.encryption", ["key_file": stateKeyFile.path, "key_env": "K"])],
                         "tokens.encryption.key_file: give either key_file or key_env"),
            Self.invalid("sealing without a key", [("tokens.encryption", ["previous_key_files": [stateKeyFile.path]])],
                         "tokens.encryption.key_file: is required"),
        ]
    }

    /// `routes` and `identities` alone (the issue 23 example's shape): no top-level upstream, tokens or refresh.
    private func identitiesOnly(_ more: [(String, Any?)]) -> [(String, Any?)] {
        [
            ("upstream", nil), ("tokens", nil), ("refresh", nil),
            ("routes", [["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": "https://hr.internal"], "identity": "hr"]]),
            ("identities", ["hr": ["tokens": ["file": workDir.appendingPathComponent("hr.json").path],
                                   "refresh": ["grant": "client_credentials", "token_url": "https://idp/token", "client_id": "hr",
                                               "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_post"]]]),
        ] + more
    }

    /// A seed-style custom grant: the refresh token in a header, client id and secret in a JSON body.
    private func customGrant(_ more: [(String, Any?)]) -> [(String, Any?)] {
        [
            ("refresh.grant", "custom"), ("refresh.token_url", nil), ("refresh.client_auth", nil),
            ("refresh.request", ["method": "POST", "url": "http://127.0.0.1:9001/auth/token",
                                 "headers": ["X-Refresh-Token": "{{refresh_token}}"],
                                 "body_json": ["clientId": "{{client_id}}", "clientSecret": "{{client_secret}}", "n": [1, true, NSNull()]]]),
            ("refresh.response", ["access_token": "/data/accessToken", "refresh_token": "/data/refreshToken", "expires_in": "/data/expiresIn"]),
        ] + more
    }

    func testSchemaAndCheckAgree() throws {
        let cases = self.cases
        var files: [URL] = []
        for (index, testCase) in cases.enumerated() {
            var config = baseConfig()
            for edit in testCase.edits { setValue(&config, path: edit.path, edit.value) }
            let file = workDir.appendingPathComponent("case-\(index).json")
            try JSONSerialization.data(withJSONObject: config, options: [.sortedKeys]).write(to: file)
            files.append(file)
        }
        let schemaErrors = try ConfigSchema.errors(for: files) // one python run for all cases
        let paths = files.map(\.path), environment = secretEnvironment
        let results = HTTPTestClient.concurrently(cases.count) { index in
            try TokenRelayProcess.runCommand(arguments: ["check", "--config", paths[index]], environment: environment)
        }
        for (index, testCase) in cases.enumerated() {
            let errors = try XCTUnwrap(schemaErrors[files[index].path], testCase.name)
            let check = try results[index].get()
            if let expected = testCase.error {
                XCTAssertFalse(errors.isEmpty, "\(testCase.name): schema accepts a config that check rejects (\(check.stderr))")
                XCTAssertEqual(check.exitCode, 2, "\(testCase.name): check should report a config error: \(check.stderr)")
                XCTAssertTrue(check.stderr.contains(expected), "\(testCase.name): expected \"\(expected)\" in: \(check.stderr)")
            } else {
                XCTAssertEqual(errors, [], "\(testCase.name): schema rejects a config that check accepts")
                XCTAssertEqual(check.exitCode, 0, "\(testCase.name): \(check.stderr)")
            }
        }
    }

    /// Every shipped config (config/*.json, deploy/systemd/config.json) is valid against the schema.
    func testEveryExampleConfigValidates() throws {
        let configDirectory = repositoryRoot.appendingPathComponent("config")
        var files = try FileManager.default.contentsOfDirectory(atPath: configDirectory.path)
            .filter { $0.hasSuffix(".json") && !$0.contains("schema") }
            .map { configDirectory.appendingPathComponent($0) }
        XCTAssertGreaterThanOrEqual(files.count, 3)
        files.append(repositoryRoot.appendingPathComponent("deploy/systemd/config.json"))
        let errors = try ConfigSchema.errors(for: files)
        for file in files {
            XCTAssertEqual(errors[file.path], [], file.lastPathComponent)
        }
    }

    /// The schema documents every key with a description, and every optional scalar with its default, and
    /// closes every object: the properties editors show must be complete.
    func testSchemaDocumentsEveryKey() throws {
        let schema = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: ConfigSchema.url)) as? [String: Any])
        func walk(_ node: [String: Any], path: String) {
            guard let properties = node["properties"] as? [String: Any] else { return }
            XCTAssertEqual(node["additionalProperties"] as? Bool, false, "\(path): additionalProperties must be false")
            let required = Set(node["required"] as? [String] ?? [])
            for (key, value) in properties {
                let keyPath = path.isEmpty ? key : "\(path).\(key)"
                guard let property = value as? [String: Any] else { XCTFail("\(keyPath): not a schema object"); continue }
                XCTAssertNotNil(property["description"] as? String, "\(keyPath): description missing")
                let isScalar = property["type"] as? String != "object"
                let hasNoNaturalDefault = ["scope", "client_secret_env", "client_secret_file", "skew_seconds", "client_id", "token_url", "client_auth", "audience", "resource",
                                           "body_json", "refresh_token", "expires_in", "expires_at", "error",
                                           "file", "username", "password_env", "password_file", "lock_seconds",
                                           // issue 20: a key file, or a default taken from the key or token_url
                                           "client_key_file", "client_key_id", "client_key_certificate_file", "client_assertion_alg", "client_assertion_audience",
                                           "client_assertion_file", "key_file", "key_id", "alg", "issuer", "subject",
                                           "subject_token_file", "actor_token_file", "actor_token_type", "requested_token_type",
                                           "key_env",
                                           // issue 25: admin.token_file (absent: the admin endpoints are open)
                                           "token_file",
                                           // issue 24: tokens.redis.url or tokens.redis.sentinel, one of them
                                           "url"].contains(key)
                if isScalar && !required.contains(key) && !hasNoNaturalDefault {
                    XCTAssertNotNil(property["default"], "\(keyPath): default missing")
                }
                walk(property, path: keyPath)
            }
        }
        walk(schema, path: "")
    }
}

/// Sets (or with nil removes) `a.b.c` in a nested JSON object, creating intermediate objects.
func setValue(_ object: inout [String: Any], path: String, _ value: Any?) {
    let parts = path.split(separator: ".", maxSplits: 1).map(String.init)
    if parts.count == 1 {
        object[parts[0]] = value
        return
    }
    var child = object[parts[0]] as? [String: Any] ?? [:]
    setValue(&child, path: parts[1], value)
    object[parts[0]] = child
}

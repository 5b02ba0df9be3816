import Foundation
import XCTest
@testable import TokenRelay

/// `tokens.redis.sentinel` as the loader reads it: exactly one of `url` and `sentinel`, the addresses,
/// `db` beside it, and one-line errors naming the field.
final class RedisSentinelConfigTests: XCTestCase {
    private func config(redis: [String: Any]) throws -> Config {
        let object: [String: Any] = [
            "listen": "127.0.0.1:8080",
            "upstream": ["url": "http://127.0.0.1:9000"],
            "tokens": ["redis": redis],
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "app", "client_auth": "none"],
        ]
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func message(_ redis: [String: Any]) -> String {
        do {
            _ = try config(redis: redis)
            return "no error"
        } catch {
            return "\(error)"
        }
    }

    private let sentinel: [String: Any] = ["addresses": ["10.0.0.5:26379", "sentinel.internal", "[::1]:26380"], "master": "tokenrelay"]

    func testSentinelInsteadOfURL() throws {
        let settings = try XCTUnwrap(config(redis: ["sentinel": sentinel, "key": "k", "db": 3, "wait_replicas": 1]).tokens.redis)
        let found = try XCTUnwrap(settings.sentinel)
        XCTAssertEqual(found.addresses, [.tcp(host: "10.0.0.5", port: 26379), .tcp(host: "sentinel.internal", port: 26379), .tcp(host: "::1", port: 26380)])
        XCTAssertEqual(found.master, "tokenrelay")
        XCTAssertNil(found.tls)
        XCTAssertEqual(settings.endpoint.database, 3)
        XCTAssertFalse(settings.endpoint.usesTLS)
        XCTAssertEqual(settings.waitReplicas, 1)
        XCTAssertEqual(settings.url, "sentinel master tokenrelay via 10.0.0.5:26379,sentinel.internal:26379,[::1]:26380")
        let tls = try XCTUnwrap(config(redis: ["sentinel": sentinel.merging(["tls": ["ca_file": "/etc/ca.pem"], "username": "s", "password_env": "S"]) { $1 },
                                               "key": "k", "tls": ["server_name": "redis.internal"]]).tokens.redis)
        XCTAssertNotNil(tls.sentinel?.tls, "TLS to the sentinels")
        XCTAssertTrue(tls.endpoint.usesTLS, "tokens.redis.tls with sentinel: TLS to the data nodes")
    }

    func testErrorsNameTheField() {
        XCTAssertEqual(message(["url": "redis://127.0.0.1", "sentinel": sentinel, "key": "k"]),
                       "tokens.redis.sentinel: set either url or sentinel, not both")
        XCTAssertEqual(message(["key": "k"]), "tokens.redis.url: is required (or sentinel, to find the master through Redis Sentinel)")
        XCTAssertEqual(message(["url": "redis://127.0.0.1", "db": 1, "key": "k"]),
                       "tokens.redis.db: goes into the url (redis://host:port/db); db is for sentinel")
        XCTAssertEqual(message(["sentinel": ["addresses": [], "master": "m"], "key": "k"]),
                       "tokens.redis.sentinel.addresses: must name at least one sentinel (host:port)")
        XCTAssertEqual(message(["sentinel": ["addresses": ["a:1", "b:99999"], "master": "m"], "key": "k"]),
                       "tokens.redis.sentinel.addresses[1]: port must be a number from 1 to 65535")
        XCTAssertEqual(message(["sentinel": ["addresses": ["redis://a:1"], "master": "m"], "key": "k"]),
                       "tokens.redis.sentinel.addresses[0]: must be host:port (no scheme, credentials or path)")
        XCTAssertEqual(message(["sentinel": ["addresses": ["a:1"]], "key": "k"]), "tokens.redis.sentinel.master: is required")
        XCTAssertEqual(message(["sentinel": ["addresses": ["a:1"], "master": "m", "username": "u"], "key": "k"]),
                       "tokens.redis.sentinel.username: needs password_env")
        XCTAssertEqual(message(["sentinel": ["addresses": ["a:1"], "master": "m", "url": "x"], "key": "k"]),
                       "tokens.redis.sentinel.url: unknown key")
        XCTAssertEqual(message(["sentinel": sentinel, "db": 70000, "key": "k"]).hasPrefix("tokens.redis.db:"), true)
    }

    func testTheGetMasterAddrReplyIsReadAsTheDataNodesAddress() throws {
        let settings = try XCTUnwrap(config(redis: ["sentinel": sentinel, "key": "k", "db": 2]).tokens.redis)
        var template = settings.endpoint
        template.password = "data-node-secret"
        let target = try XCTUnwrap(RedisSentinelTarget.build(settings: settings, dataNode: template))
        let asked = target.sentinels[0]
        let reply = RedisReply.array([.string(Data("10.0.0.9".utf8)), .string(Data("6380".utf8))])
        let master = try target.masterEndpoint(from: reply, sentinel: asked).get()
        XCTAssertEqual(master.address, .tcp(host: "10.0.0.9", port: 6380))
        XCTAssertEqual(master.database, 2)
        XCTAssertEqual(master.password, "data-node-secret", "the data nodes' login, not the sentinels'")
        XCTAssertNil(asked.password)
        guard case .failure(let unknown) = target.masterEndpoint(from: .null, sentinel: asked) else { return XCTFail("null is no master") }
        XCTAssertEqual(unknown.description, "sentinel 10.0.0.5:26379 does not know a master named tokenrelay")
        guard case .failure = target.masterEndpoint(from: .array([.string(Data("h".utf8)), .string(Data("0".utf8))]), sentinel: asked) else {
            return XCTFail("port 0 is refused")
        }
    }

    /// What `check` runs (Preflight): the sentinels' password variable and TLS files are checked, one line
    /// naming the field; nothing is contacted.
    func testCheckValidatesTheSentinelLogin() throws {
        let settings = try XCTUnwrap(config(redis: ["sentinel": sentinel.merging(["username": "s", "password_env": "TOKENRELAY_TEST_UNSET_SENTINEL_PW"]) { $1 },
                                                    "key": "k"]).tokens.redis)
        XCTAssertThrowsError(try Preflight.redisEndpoint(settings)) { error in
            XCTAssertEqual("\(error)", "tokens.redis.sentinel.password_env: environment variable TOKENRELAY_TEST_UNSET_SENTINEL_PW is not set or empty")
        }
        let badTLS = try XCTUnwrap(config(redis: ["sentinel": sentinel.merging(["tls": ["ca_file": "/nonexistent/ca.pem"]]) { $1 }, "key": "k"]).tokens.redis)
        XCTAssertThrowsError(try Preflight.redisEndpoint(badTLS)) { error in
            XCTAssertTrue("\(error)".hasPrefix("tokens.redis.sentinel.tls: "), "\(error)")
        }
        let fine = try XCTUnwrap(config(redis: ["sentinel": sentinel, "key": "k"]).tokens.redis)
        XCTAssertNoThrow(try Preflight.redisEndpoint(fine))
    }
}

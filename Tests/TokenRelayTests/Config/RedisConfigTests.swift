import Foundation
import XCTest
@testable import TokenRelay

/// `tokens.redis` as the loader reads it: URL forms, defaults, and the rules across fields that a JSON
/// schema cannot state (the lock must outlive a refresh).
final class RedisConfigTests: XCTestCase {
    private func config(redis: [String: Any], file: String? = nil, timeouts: [String: Any]? = nil) throws -> Config {
        var tokens: [String: Any] = ["redis": redis]
        tokens["file"] = file
        var object: [String: Any] = [
            "listen": "127.0.0.1:8080",
            "upstream": ["url": "http://127.0.0.1:9000"],
            "tokens": tokens,
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "app", "client_auth": "none"],
        ]
        object["timeouts"] = timeouts
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func message(_ body: () throws -> Any) -> String {
        do {
            _ = try body()
            return "no error"
        } catch {
            return "\(error)"
        }
    }

    func testURLFormsAndDefaults() throws {
        let tcp = try XCTUnwrap(config(redis: ["url": "redis://redis.internal:6380/3", "key": "k"]).tokens.redis)
        XCTAssertEqual(tcp.endpoint.address, .tcp(host: "redis.internal", port: 6380))
        XCTAssertEqual(tcp.endpoint.database, 3)
        XCTAssertEqual(tcp.commandTimeoutSeconds, 2)
        XCTAssertEqual(tcp.effectiveLockSeconds(refreshSeconds: 60), 70)
        let bare = try XCTUnwrap(config(redis: ["url": "redis://10.0.0.5", "key": "k"]).tokens.redis)
        XCTAssertEqual(bare.endpoint.address, .tcp(host: "10.0.0.5", port: 6379))
        XCTAssertEqual(bare.endpoint.database, 0)
        let v6 = try XCTUnwrap(config(redis: ["url": "redis://[::1]:7000/1", "key": "k"]).tokens.redis)
        XCTAssertEqual(v6.endpoint.address, .tcp(host: "::1", port: 7000))
        let unix = try XCTUnwrap(config(redis: ["url": "unix:///run/redis.sock", "key": "k"]).tokens.redis)
        XCTAssertEqual(unix.endpoint.address, .unix(path: "/run/redis.sock"))
        XCTAssertNil(try config(redis: ["url": "unix:///run/redis.sock", "key": "k"]).tokens.file)
    }

    func testRedissReadsATLSBlockShapedLikeTheOthers() throws {
        let bare = try XCTUnwrap(config(redis: ["url": "rediss://redis.internal:6380/2", "key": "k"]).tokens.redis)
        XCTAssertEqual(bare.endpoint.address, .tcp(host: "redis.internal", port: 6380))
        XCTAssertTrue(bare.endpoint.usesTLS)
        XCTAssertEqual(bare.endpoint.database, 2)
        XCTAssertNil(bare.tls)
        XCTAssertEqual(bare.url, "redis.internal:6380/2 (TLS)")
        let full = try XCTUnwrap(config(redis: ["url": "REDISS://10.0.0.5", "key": "k", "tls": [
            "ca_file": "/etc/redis/ca.pem", "server_name": "redis.internal", "client_cert": "/c.pem", "client_key": "/c.key",
            "insecure_skip_verify": false]]).tokens.redis)
        XCTAssertEqual(full.endpoint.address, .tcp(host: "10.0.0.5", port: 6379))
        XCTAssertEqual(full.tls?.caFile, "/etc/redis/ca.pem")
        XCTAssertEqual(full.tls?.serverName, "redis.internal")
        XCTAssertEqual(full.tls?.clientCert, "/c.pem")
        XCTAssertEqual(full.tls?.clientKey, "/c.key")
        XCTAssertTrue(full.restartOnlyDescription.contains("tls ca_file /etc/redis/ca.pem"), full.restartOnlyDescription)
        XCTAssertFalse(try XCTUnwrap(config(redis: ["url": "redis://h", "key": "k"]).tokens.redis).endpoint.usesTLS)
        let plain = message { try self.config(redis: ["url": "redis://h", "key": "k", "tls": ["ca_file": "/x"]]) }
        XCTAssertEqual(plain, "tokens.redis.tls: is only allowed with a rediss:// URL")
        let missingCA = message {
            try Preflight.redisEndpoint(XCTUnwrap(self.config(redis: ["url": "rediss://h", "key": "k", "tls": ["ca_file": "/nonexistent/ca.pem"]]).tokens.redis))
        }
        XCTAssertTrue(missingCA.hasPrefix("tokens.redis.tls: cannot read CA file /nonexistent/ca.pem"), missingCA)
    }

    func testBadURLsNameTheField() {
        for (url, expected) in [("redis://h:0", "port must be"), ("redis://h:99999", "port must be"), ("redis://h/x", "database"),
                                ("unix://relative", "absolute"), ("redis://", "must name a host"), ("redis://[::1", "closing ]")] {
            let text = message { try self.config(redis: ["url": url, "key": "k"]) }
            XCTAssertTrue(text.hasPrefix("tokens.redis.url: ") && text.contains(expected), "\(url): \(text)")
        }
    }

    /// Race it prevents: a lock that expires while its holder's refresh is still at the token server lets
    /// a second relay present the same refresh token.
    func testLockMustOutliveARefresh() throws {
        let short = message { try self.config(redis: ["url": "redis://h", "key": "k", "lock_seconds": 30]) }
        XCTAssertTrue(short.hasPrefix("tokens.redis.lock_seconds: must be at least"), short)
        XCTAssertTrue(short.contains("64"), short)
        let fits = try config(redis: ["url": "redis://h", "key": "k", "lock_seconds": 5, "command_timeout_seconds": 0.5],
                              timeouts: ["refresh_seconds": 3])
        XCTAssertEqual(fits.tokens.redis?.effectiveLockSeconds(refreshSeconds: 3), 5)
    }

    func testUsernameNeedsAPassword() {
        let text = message { try self.config(redis: ["url": "redis://h", "key": "k", "username": "u"]) }
        XCTAssertTrue(text.hasPrefix("tokens.redis.username: needs password_env"), text)
    }
}

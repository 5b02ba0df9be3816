import Foundation
import XCTest
@testable import TokenRelay

/// The Redis transport against a real redis-server: commands and replies in order over TCP and a unix
/// socket, Lua, pub/sub pushes, AUTH failures and a dead server, each bounded by a loop-side deadline.
final class RedisConnectionTests: XCTestCase {
    /// Runs the loop until `body` calls `done`, or fails after `timeout` seconds.
    private func runLoop(timeout: Double = 5, _ body: (EventLoop, @escaping () -> Void) -> Void) throws {
        let loop = try EventLoop()
        var finished = false
        let deadline = LoopEvent(loop: loop) { _ in loop.stop() }
        deadline.schedule(after: timeout)
        body(loop) {
            finished = true
            loop.stop()
        }
        loop.run()
        XCTAssertTrue(finished, "the exchange did not finish within \(timeout) s")
    }

    func testCommandsOverUnixSocketAndTCPAnswerInOrder() throws {
        let redis = try RedisServerProcess(tcp: true)
        for address in [RedisEndpoint.Address.unix(path: redis.socketPath), .tcp(host: "127.0.0.1", port: redis.tcpPort!)] {
            var replies: [RedisReply] = []
            try runLoop { loop, done in
                let connection = RedisConnection(loop: loop, endpoint: RedisEndpoint(address: address, database: 2), commandTimeout: 2)
                connection.open { error in XCTAssertNil(error) }
                connection.send(["DEL", "n"]) { _ in }
                connection.send(["SET", "k", "v\r\n\0binary"]) { replies.append((try? $0.get()) ?? .null) }
                connection.send(["GET", "k"]) { replies.append((try? $0.get()) ?? .null) }
                connection.send(["EVAL", "return {1, 'two', redis.call('INCR', KEYS[1])}", "1", "n"]) { replies.append((try? $0.get()) ?? .null) }
                connection.send(["NOSUCHCOMMAND"]) { result in
                    replies.append((try? result.get()) ?? .null)
                    connection.close()
                    done()
                }
            }
            XCTAssertEqual(replies.count, 4)
            XCTAssertEqual(replies[0], .status("OK"))
            XCTAssertEqual(replies[1], .string(Data("v\r\n\0binary".utf8)))
            XCTAssertEqual(replies[2], .array([.integer(1), .string(Data("two".utf8)), .integer(1)]))
            guard case .error(let message) = replies[3] else { return XCTFail("expected an error reply, got \(replies[3])") }
            XCTAssertTrue(message.contains("unknown command"), message)
        }
        XCTAssertEqual(try redis.cli(["-n", "2", "GET", "n"]), "1")
    }

    func testSubscribedConnectionDeliversPublishedMessagesAsPushes() throws {
        let redis = try RedisServerProcess()
        let endpoint = RedisEndpoint(address: .unix(path: redis.socketPath))
        var messages: [RedisReply] = []
        try runLoop { loop, done in
            let subscriber = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: 2)
            let publisher = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: 2)
            subscriber.onPush = { reply in
                messages.append(reply)
                subscriber.close()
                publisher.close()
                done()
            }
            subscriber.open { _ in }
            publisher.open { _ in }
            subscriber.send(["SUBSCRIBE", "updates"]) { _ in
                publisher.send(["PUBLISH", "updates", "7"]) { _ in }
            }
        }
        XCTAssertEqual(messages, [.array([.string(Data("message".utf8)), .string(Data("updates".utf8)), .string(Data("7".utf8))])])
    }

    func testWrongPasswordAndDeadServerFailWithTheReason() throws {
        let redis = try RedisServerProcess()
        try redis.cli(["CONFIG", "SET", "requirepass", "right"])
        var loginError: String?
        var kept: RedisConnection?
        try runLoop { loop, done in
            let connection = RedisConnection(loop: loop, endpoint: RedisEndpoint(address: .unix(path: redis.socketPath), password: "wrong"),
                                             commandTimeout: 2)
            kept = connection
            connection.open { error in
                loginError = error
                done()
            }
        }
        XCTAssertNotNil(loginError)
        XCTAssertFalse(loginError?.contains("wrong") ?? true, "the password must not appear in the error")
        let socket = redis.socketPath
        redis.stop()
        var failure: String?
        var closedReason: String?
        try runLoop { loop, done in
            let connection = RedisConnection(loop: loop, endpoint: RedisEndpoint(address: .unix(path: socket)), commandTimeout: 2)
            kept = connection
            connection.onClosed = { closedReason = $0 }
            connection.open { _ in }
            connection.send(["GET", "x"]) { result in
                if case .failure(let error) = result { failure = error.description }
                done()
            }
        }
        XCTAssertNotNil(failure)
        if let closedReason { XCTAssertEqual(failure, closedReason) }
        XCTAssertTrue(failure?.contains(socket) ?? false, failure ?? "")
        _ = kept
    }
}

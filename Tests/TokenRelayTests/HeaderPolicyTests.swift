import XCTest
@testable import TokenRelay

final class HeaderPolicyTests: XCTestCase {
    func testRequestDropsHopByHopConnectionListedAndReplacedHeaders() {
        let forwarded = HeaderPolicy.forwardedRequestHeaders([
            ("Host", "client.example"), ("Authorization", "Bearer theirs"), ("Connection", "keep-alive, X-Secret-Hop"),
            ("X-Secret-Hop", "1"), ("Content-Length", "5"), ("Transfer-Encoding", "chunked"), ("TE", "trailers"),
            ("Expect", "100-continue"), ("Accept", "application/json"), ("X-Trace", "abc"),
        ])
        XCTAssertEqual(forwarded.map(\.name), ["Accept", "X-Trace"])
    }

    func testResponseKeepsLengthAndDropsConnectionListed() {
        let forwarded = HeaderPolicy.forwardedResponseHeaders([
            ("Content-Length", "10"), ("Connection", "close, X-Hop"), ("X-Hop", "1"), ("Transfer-Encoding", "chunked"),
            ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
        ])
        XCTAssertEqual(forwarded.map(\.name), ["Content-Length", "Set-Cookie", "Set-Cookie"])
    }
}

final class InjectedHeaderPolicyTests: XCTestCase {
    private let incoming: [(name: String, value: String)] = [
        ("AccessToken", "forged"), ("Authorization", "Basic abc"), ("X-Other", "1"), ("Host", "client"),
    ]

    func testCustomHeaderDropsClientValueAndKeepsAuthorization() {
        let names = HeaderPolicy.forwardedRequestHeaders(incoming, injectedHeader: "accesstoken").map(\.name)
        XCTAssertEqual(names, ["Authorization", "X-Other"])
    }

    func testDefaultDropsAuthorization() {
        XCTAssertEqual(HeaderPolicy.forwardedRequestHeaders(incoming).map(\.name), ["AccessToken", "X-Other"])
    }

    func testPassthroughKeepsBoth() {
        let names = HeaderPolicy.forwardedRequestHeaders(incoming, keepAuthorization: true, injectedHeader: "accesstoken").map(\.name)
        XCTAssertEqual(names, ["AccessToken", "Authorization", "X-Other"])
    }
}

final class HTTPSyntaxFieldTests: XCTestCase {
    func testFieldKeysAreASCIILowercase() {
        XCTAssertEqual(HTTPSyntax.fieldKey("X-Forwarded-For"), "x-forwarded-for")
        XCTAssertEqual(HTTPSyntax.fieldKey("accept"), "accept")
        XCTAssertTrue(HTTPSyntax.isField("CONTENT-Length", "content-length"))
        XCTAssertFalse(HTTPSyntax.isField("Content-Lengthx", "content-length"))
        XCTAssertFalse(HTTPSyntax.isField("Content-Lengt", "content-length"))
        XCTAssertEqual(HTTPSyntax.trimmedOWS(" \tkeep-alive \t"), "keep-alive")
        XCTAssertEqual(HTTPSyntax.trimmedOWS("  "), "")
    }

    func testConnectionListedNamesAreCaseInsensitive() {
        let forwarded = HeaderPolicy.forwardedResponseHeaders([("CONNECTION", " X-Hop ,\tKEEP-ALIVE"), ("x-hop", "1"), ("Keep-Alive", "5"), ("X-Kept", "1")])
        XCTAssertEqual(forwarded.map(\.name), ["X-Kept"])
    }
}

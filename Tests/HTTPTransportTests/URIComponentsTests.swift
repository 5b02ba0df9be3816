import HTTPTransport
import XCTest

final class URIComponentsTests: XCTestCase {

    func testSplitsAFullURL() throws {
        let uri = try XCTUnwrap(URIComponents(parsing: "HTTPS://user:pw@Example.COM:8443/a/b%20c?x=1&y#frag"))
        XCTAssertEqual(uri.scheme, "HTTPS", "the scheme as written; callers compare case-insensitively")
        XCTAssertEqual(uri.userinfo, "user:pw")
        XCTAssertEqual(uri.host, "Example.COM")
        XCTAssertEqual(uri.port, 8443)
        XCTAssertEqual(uri.path, "/a/b%20c", "percent-encoding is kept")
        XCTAssertEqual(uri.query, "x=1&y")
        XCTAssertEqual(uri.fragment, "frag")
    }

    func testAbsentPartsAreNilAndAnAbsentPathIsEmpty() throws {
        let uri = try XCTUnwrap(URIComponents(parsing: "http://example.com"))
        XCTAssertEqual(uri.host, "example.com")
        XCTAssertNil(uri.port)
        XCTAssertEqual(uri.path, "")
        XCTAssertNil(uri.query)
        XCTAssertNil(uri.fragment)
        XCTAssertNil(uri.userinfo)
        // An empty query is present, not absent.
        XCTAssertEqual(URIComponents(parsing: "http://h/p?")?.query, "")
    }

    func testIPv6HostKeepsItsBrackets() throws {
        let uri = try XCTUnwrap(URIComponents(parsing: "http://[::1]:9000/x"))
        XCTAssertEqual(uri.host, "[::1]")
        XCTAssertEqual(uri.port, 9000)
        XCTAssertNil(URIComponents(parsing: "http://[::1/x"), "an unclosed bracket is not a URI")
    }

    func testOriginFormHasOnlyPathAndQuery() throws {
        let uri = try XCTUnwrap(URIComponents(parsing: "/v1/items?page=2"))
        XCTAssertNil(uri.scheme)
        XCTAssertNil(uri.host)
        XCTAssertEqual(uri.path, "/v1/items")
        XCTAssertEqual(uri.query, "page=2")
    }

    func testPortEdgeCases() {
        XCTAssertEqual(URIComponents(parsing: "http://h:0/")?.port, 0, "a zero port is reported as written")
        XCTAssertNil(URIComponents(parsing: "http://h:99999999999999999999/"), "a port that does not fit is refused, never wrapped")
        XCTAssertNil(URIComponents(parsing: "http://h:65536/"), "a port over 65535 is refused")
        XCTAssertEqual(URIComponents(parsing: "http://h:65535/")?.port, 65535)
        XCTAssertNil(URIComponents(parsing: "http://h:12ab/"))
    }

    func testRefusesWhatIsNotAURI() {
        XCTAssertNil(URIComponents(parsing: "http://exa mple.com/"), "whitespace")
        XCTAssertNil(URIComponents(parsing: "http://h/a\u{0}b"), "a NUL byte would cut the text short for the C parser")
        XCTAssertNil(URIComponents(parsing: "http://h/a\"b"))
    }
}

@testable import HTTPTransport
import HTTPWire
import XCTest
@testable import TokenRelay

/// The header rules on a field table laid out as HTTPWire lays one out (offsets into the head's bytes),
/// written into a field block as the transport writes a head.
enum FieldRules {
    static func table<R>(_ fields: [(String, String)], _ body: (FieldTable) -> R) -> R {
        var bytes: [UInt8] = []
        var lines: [FieldLine] = []
        var options: ConnectionOptions = []
        for (name, value) in fields {
            let nameStart = bytes.count
            bytes += Array(name.utf8)
            let nameEnd = bytes.count
            bytes += Array(": ".utf8)
            let valueStart = bytes.count
            bytes += Array(value.utf8)
            lines.append(FieldLine(name: nameStart..<nameEnd, value: valueStart..<bytes.count, nameHasUnderscore: name.contains("_")))
            bytes += Array("\r\n".utf8)
            if name.lowercased() == "connection" {
                // As HTTPWire sorts the elements.
                for element in value.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }) where !element.isEmpty {
                    switch element {
                    case "close": options.insert(.close)
                    case "keep-alive": options.insert(.keepAlive)
                    case "upgrade": options.insert(.upgrade)
                    default: options.insert(.otherTokens)
                    }
                }
            }
        }
        // As the transport lends a received head's fields (the internal initialiser: the rules under test
        // include names and values the parser would refuse).
        return bytes.withUnsafeBytes { body(FieldTable(ReceivedFields(bytes: $0, lines: lines, connection: options))) }
    }

    /// What the upstream gets of the client's fields (no Host or token: the exchange adds those).
    static func request(_ fields: [(String, String)], keepAuthorization: Bool = false, injectedHeader: String = "authorization",
                        clientAddress: String? = nil, forwarding: Config.Forwarding = .none) -> [(name: String, value: String)] {
        var block = HTTPFieldBlock()
        table(fields) { table in
            Array(injectedHeader.utf8).withUnsafeBytes { injected in
                ForwardingHeaders.write(table, forwarded: { index in
                    HeaderPolicy.forwardsRequestField(index, of: table, keepAuthorization: keepAuthorization, injectedHeader: injected)
                }, client: clientAddress.map { ForwardedClient(address: $0) }, settings: forwarding, into: &block)
            }
        }
        return lines(block)
    }

    static func response(_ fields: [(String, String)]) -> [(name: String, value: String)] {
        var block = HTTPFieldBlock()
        table(fields) { HeaderPolicy.writeForwardedResponseFields($0, into: &block) }
        return lines(block)
    }

    private static func lines(_ block: HTTPFieldBlock) -> [(name: String, value: String)] {
        String(decoding: block.serialized, as: UTF8.self).components(separatedBy: "\r\n").filter { !$0.isEmpty }.map { line in
            let colon = line.firstIndex(of: ":")!
            return (String(line[..<colon]), String(line[line.index(colon, offsetBy: 2)...]))
        }
    }
}

extension Config.Forwarding {
    static var none: Config.Forwarding {
        var settings = Config.Forwarding()
        settings.xForwardedFor = false
        settings.xForwardedProto = false
        settings.via = false
        return settings
    }
}

final class HeaderPolicyTests: XCTestCase {
    func testRequestDropsHopByHopConnectionListedAndReplacedHeaders() {
        let forwarded = FieldRules.request([
            ("Host", "client.example"), ("Authorization", "Bearer theirs"), ("Connection", "keep-alive, X-Secret-Hop"),
            ("X-Secret-Hop", "1"), ("Content-Length", "5"), ("Transfer-Encoding", "chunked"), ("TE", "trailers"),
            ("Expect", "100-continue"), ("Accept", "application/json"), ("X-Trace", "abc"),
        ])
        XCTAssertEqual(forwarded.map(\.name), ["Accept", "X-Trace"])
        XCTAssertEqual(forwarded.map(\.value), ["application/json", "abc"])
    }

    /// Content-Length is the transport's to write, from the length it frames the body by.
    func testResponseDropsFramingAndConnectionListed() {
        let forwarded = FieldRules.response([
            ("Content-Length", "10"), ("Connection", "close, X-Hop"), ("X-Hop", "1"), ("Transfer-Encoding", "chunked"),
            ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
        ])
        XCTAssertEqual(forwarded.map(\.name), ["Set-Cookie", "Set-Cookie"])
        XCTAssertEqual(forwarded.map(\.value), ["a=1", "b=2"])
    }

    func testConnectionListedNamesAreCaseInsensitive() {
        let forwarded = FieldRules.response([("CONNECTION", " X-Hop ,\tKEEP-ALIVE"), ("x-hop", "1"), ("Keep-Alive", "5"), ("X-Kept", "1")])
        XCTAssertEqual(forwarded.map(\.name), ["X-Kept"])
    }

    /// Without another token the listed names are known from the options alone.
    func testConnectionOptionsOnlyDropTheirOwnNames() {
        let forwarded = FieldRules.response([("Connection", "Close"), ("close", "x"), ("Keep-Alive", "5"), ("Upgrade", "h2c"), ("X-Kept", "1")])
        XCTAssertEqual(forwarded.map(\.name), ["X-Kept"])
        let kept = FieldRules.response([("Server", "s"), ("Close", "x")])
        XCTAssertEqual(kept.map(\.name), ["Server", "Close"])
    }

    func testForwardingFieldsAreFoldedReplacedAndAppended() {
        var forwarding = Config.Forwarding()
        forwarding.dropUnderscoreHeaders = true
        let forwarded = FieldRules.request([
            ("X-Forwarded-For", "10.0.0.1"), ("Accept", "*/*"), ("x-forwarded-for", ""), ("X-FORWARDED-FOR", "10.0.0.2"),
            ("X-Forwarded-Proto", "https"), ("Via", "1.0 edge"), ("X_User", "admin"),
        ], clientAddress: "127.0.0.1", forwarding: forwarding)
        XCTAssertEqual(forwarded.map(\.name), ["Accept", "X-Forwarded-For", "X-Forwarded-Proto", "Via"])
        XCTAssertEqual(forwarded.map(\.value), ["*/*", "10.0.0.1, 10.0.0.2, 127.0.0.1", "http", "1.0 edge, 1.1 tokenrelay"])
    }

    /// Without a list of the client's own (none sent, only empty ones, or the client's listed as hop-by-hop),
    /// each forwarding field is this hop's alone.
    func testForwardingFieldsOfThisHopAlone() {
        let expected = ["Accept: */*", "X-Forwarded-For: 127.0.0.1", "X-Forwarded-Proto: http", "Via: 1.1 tokenrelay"]
        for fields in [[("Accept", "*/*")], [("X-Forwarded-For", ""), ("Accept", "*/*"), ("Via", "")],
                       [("Connection", "X-Forwarded-For, Via"), ("X-Forwarded-For", "10.0.0.9"), ("Via", "1.0 x"), ("Accept", "*/*")]] {
            let forwarded = FieldRules.request(fields, clientAddress: "127.0.0.1", forwarding: Config.Forwarding())
            XCTAssertEqual(forwarded.map { "\($0.name): \($0.value)" }, expected, "\(fields)")
        }
    }

    func testForwardingFieldsSwitchedOffPassUnchanged() {
        let forwarded = FieldRules.request([("X-Forwarded-For", "10.0.0.1"), ("Via", "1.0 edge"), ("X_User", "a")])
        XCTAssertEqual(forwarded.map(\.name), ["X-Forwarded-For", "Via", "X_User"])
    }
}

final class InjectedHeaderPolicyTests: XCTestCase {
    private let incoming: [(String, String)] = [
        ("AccessToken", "forged"), ("Authorization", "Basic abc"), ("X-Other", "1"), ("Host", "client"),
    ]

    func testCustomHeaderDropsClientValueAndKeepsAuthorization() {
        let names = FieldRules.request(incoming, injectedHeader: "accesstoken").map(\.name)
        XCTAssertEqual(names, ["Authorization", "X-Other"])
    }

    func testDefaultDropsAuthorization() {
        XCTAssertEqual(FieldRules.request(incoming).map(\.name), ["AccessToken", "X-Other"])
    }

    func testPassthroughKeepsBoth() {
        let names = FieldRules.request(incoming, keepAuthorization: true, injectedHeader: "accesstoken").map(\.name)
        XCTAssertEqual(names, ["AccessToken", "Authorization", "X-Other"])
    }
}

final class RequestHygieneRuleTests: XCTestCase {
    private func violation(_ fields: [(String, String)], isHTTP11: Bool = true) -> String? {
        FieldRules.table(fields) { RequestHygiene.check($0, isHTTP11: isHTTP11)?.description }
    }

    func testAmbiguousFramingIsRefused() {
        XCTAssertNil(violation([("Host", "a"), ("Content-Length", "5")]))
        XCTAssertNil(violation([("Host", "a"), ("Transfer-Encoding", "Chunked")]))
        XCTAssertEqual(violation([("Host", "a"), ("Content-Length", "5"), ("Transfer-Encoding", "chunked")]),
                       "Content-Length together with Transfer-Encoding")
        XCTAssertEqual(violation([("Host", "a"), ("Content-Length", "5"), ("Content-Length", "5")]), "more than one Content-Length")
        XCTAssertEqual(violation([("Host", "a"), ("Content-Length", "+3")]), "invalid Content-Length")
        XCTAssertEqual(violation([("Host", "a"), ("Content-Length", "")]), "invalid Content-Length")
        XCTAssertEqual(violation([("Host", "a"), ("Transfer-Encoding", "gzip, chunked")]), "unsupported Transfer-Encoding")
        XCTAssertEqual(violation([("Host", "a"), ("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")]),
                       "unsupported Transfer-Encoding")
        XCTAssertEqual(violation([("Host", "a"), ("Transfer-Encoding", "chunked,")]), "unsupported Transfer-Encoding")
    }

    func testNamesValuesAndHost() {
        XCTAssertEqual(violation([("", "x"), ("Host", "a")]), "empty header name")
        XCTAssertEqual(violation([("Bad Name", "x"), ("Host", "a")]), "invalid header name")
        XCTAssertEqual(violation([("X-A", "a\u{1}b"), ("Host", "a")]), "control character in the value of X-A")
        XCTAssertEqual(violation([]), "a request needs exactly one Host header")
        XCTAssertNil(violation([], isHTTP11: false))
        XCTAssertEqual(violation([("Host", "a"), ("host", "b")], isHTTP11: false), "a request needs exactly one Host header")
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
}

/// The token header is made once per token: still judged before it reaches a head, and never stale.
final class TokenHeaderFieldTests: XCTestCase {
    private func written(_ field: PreparedField?) -> String {
        var block = HTTPFieldBlock()
        if let field { block.append(field) }
        return String(decoding: block.serialized, as: UTF8.self)
    }

    func testEachTokenGetsItsOwnCheckedField() {
        let fields = TokenHeaderField(header: "Authorization")
        let first = "Bearer one"
        XCTAssertEqual(written(fields.field(for: first)), "Authorization: Bearer one\r\n")
        XCTAssertEqual(written(fields.field(for: first)), "Authorization: Bearer one\r\n")
        XCTAssertEqual(written(fields.field(for: "Bearer " + "two")), "Authorization: Bearer two\r\n")
        XCTAssertEqual(written(fields.field(for: "Bearer a\r\nX-Injected: 1")), "")
        XCTAssertEqual(written(fields.field(for: first)), "Authorization: Bearer one\r\n")
    }
}

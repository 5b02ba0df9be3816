import Foundation
import XCTest
@testable import TokenRelay

/// `JSONReader`/`JSONWriter` replaced Foundation's JSONSerialization in the binary; these tests hold
/// them to what JSONSerialization answers for the same input (the tests may still link Foundation).
final class JSONReaderWriterTests: XCTestCase {
    /// Documents both parsers accept, and what the reader must make of them.
    func testReadsWhatJSONSerializationRead() throws {
        let documents = [
            #"{"access_token":"a.b-c","expires_in":3600,"scope":"read write","ok":true,"off":false,"none":null}"#,
            #"{"n":[0,-1,1.5,-2.25e3,1E2,12345678901234,0.000001,9007199254740993],"s":"\u00e9\ud83d\ude00\/\"\\\b\f\n\r\t"}"#,
            "\u{FEFF}{\"bom\": 1}", " [ ] ", "{}", #"[{"a":[{"b":{}}]}]"#, #"{"ü":"ß","k":"\u0000"}"#,
            "{\"a\":1,}", "[1,2,]", #"{"a":1,"a":2}"#,
        ]
        for text in documents {
            let expected = try JSONSerialization.jsonObject(with: Data(text.utf8))
            let actual = try JSONReader.parse(Array(text.utf8))
            XCTAssertTrue(Self.same(actual, expected), "\(text): \(actual) vs \(expected)")
        }
    }

    func testRefusesWhatJSONSerializationRefused() {
        let documents = ["", "nul", "{", "[1 2]", #"{"a" 1}"#, #"{a:1}"#, "'a'", #"["\x"]"#, "[01]", "[1.]", "[.5]", "[-]",
                         "[1e]", "[+1]", #"["a"#, "[\"\u{01}\"]", "[1] [2]", #"["\ud800"]"#, "[1e400]", "[NaN]", "[Infinity]",
                         "\"fragment\"", "42"]
        for text in documents {
            XCTAssertThrowsError(try JSONSerialization.jsonObject(with: Data(text.utf8)), "Foundation accepted \(text)")
            XCTAssertThrowsError(try JSONReader.parse(Array(text.utf8)), text)
        }
        XCTAssertThrowsError(try JSONReader.parse(Array([0x5B, 0x22, 0xFF, 0x22, 0x5D])), "invalid UTF-8 in a string")
    }

    func testFragmentsWhenAllowed() throws {
        XCTAssertEqual(try JSONReader.parse(Array("\"error\"".utf8), fragmentsAllowed: true) as? String, "error")
        XCTAssertEqual((try JSONReader.parse(Array(" 7 ".utf8), fragmentsAllowed: true) as? JSONNumber)?.doubleValue, 7)
    }

    func testErrorsNameAPlaceNotTheText() {
        do {
            _ = try JSONReader.parse(Array("{\n  \"access_token\": secret-value\n}".utf8))
            XCTFail("accepted")
        } catch {
            XCTAssertEqual("\(error)", "invalid value at line 2, column 19")
            XCTAssertFalse("\(error)".contains("secret"))
        }
    }

    func testNestingIsBounded() {
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        XCTAssertThrowsError(try JSONReader.parse(Array(deep.utf8)))
        let fine = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        XCTAssertNoThrow(try JSONReader.parse(Array(fine.utf8)))
    }

    /// The token file, /status and the in-flight record keep the bytes they had.
    func testWritesWhatJSONSerializationWrote() throws {
        let documents = [
            #"{"access_token":"a/b","refresh_token":"r","expires_at":"2026-11-21T10:00:00Z","note":"x\u0001\"\\\n\t é","n":[1,2.5,-3,1e20,0.1,1.0],"o":{},"e":[],"z":null,"t":true}"#,
            #"{"b":1,"a":{"d":[{"y":1,"x":2}],"c":false},"A":3,"_u":4,"a10":5,"a9":6}"#,
            #"{"token_type":1,"Token_Type":2,"id_token":3,"idToken":4,"x-1":5,"x_1":6,"x1":7,"X1":8,"a02":9,"a2b":10,"e":12,"z":13}"#,
            #"{"not-before-policy":0,"not_before":1,"session_state":"s","scope":"a b","refresh_expires_in":1800,"expires_in":300,"access_token":"t","refresh_token":"r","token_type":"Bearer","expires_at":"x","id_token":"i","a.b":1,"a b":2,"a$":3,"a~":4,"a+":5,"a/":6}"#,
            "[]", "{}", #"[{"k":[]}]"#,
        ]
        for text in documents {
            let foundationTree = try JSONSerialization.jsonObject(with: Data(text.utf8))
            let ourTree = try JSONReader.parse(Array(text.utf8))
            for (ours, theirs) in [(JSONWriter.Options([.sortedKeys]), JSONSerialization.WritingOptions([.sortedKeys])),
                                   ([.sortedKeys, .prettyPrinted], [.sortedKeys, .prettyPrinted]),
                                   ([.sortedKeys, .withoutEscapingSlashes], [.sortedKeys, .withoutEscapingSlashes])] {
                let expected = String(decoding: try JSONSerialization.data(withJSONObject: foundationTree, options: theirs), as: UTF8.self)
                XCTAssertEqual(try JSONWriter.string(ourTree, options: ours), expected, "\(text) \(ours)")
            }
        }
    }

    func testWritesSwiftValuesBuiltInCode() throws {
        let report: [String: Any] = ["count": 3, "ratio": 0.25, "ready": false, "reason": JSONNull(), "nested": ["a": [1, "b"]],
                                     "generation": UInt64(7), "port": UInt16(8080), "small": Int8(-3), "half": Float(0.5)]
        XCTAssertEqual(try JSONWriter.string(report, options: [.sortedKeys]),
                       #"{"count":3,"generation":7,"half":0.5,"nested":{"a":[1,"b"]},"port":8080,"ratio":0.25,"ready":false,"reason":null,"small":-3}"#)
        XCTAssertThrowsError(try JSONWriter.data("bare"), "a fragment needs fragmentsAllowed")
        XCTAssertEqual(try JSONWriter.string("a/b", options: [.fragmentsAllowed, .withoutEscapingSlashes]), #""a/b""#)
        XCTAssertThrowsError(try JSONWriter.data(["x": Double.infinity]))
        XCTAssertThrowsError(try JSONWriter.data(["x": Optional<Int>.none as Any]))
    }

    /// Structural equality of a JSONReader tree and a JSONSerialization tree.
    private static func same(_ ours: Any, _ theirs: Any) -> Bool {
        switch (ours, theirs) {
        case let (a as [String: Any], b as [String: Any]):
            return a.count == b.count && a.allSatisfy { key, value in b[key].map { same(value, $0) } ?? false }
        case let (a as [Any], b as [Any]):
            return a.count == b.count && zip(a, b).allSatisfy { same($0, $1) }
        case let (a as String, b as String):
            return a == b
        case let (a as Bool, b as NSNumber):
            return String(cString: b.objCType) == "c" && a == b.boolValue
        case let (a as JSONNumber, b as NSNumber):
            return String(cString: b.objCType) != "c" && a.doubleValue == b.doubleValue
        case (is JSONNull, is NSNull):
            return true
        default:
            return false
        }
    }
}

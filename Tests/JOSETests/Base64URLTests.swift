import Foundation
import XCTest
import JOSE

final class Base64URLTests: XCTestCase {
    func testRFC4648Vectors() {
        let vectors = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE", "foobar": "Zm9vYmFy"]
        for (plain, encoded) in vectors {
            XCTAssertEqual(Base64URL.encode(Array(plain.utf8)), encoded)
            XCTAssertEqual(Base64URL.decode(Substring(encoded)), Array(plain.utf8))
        }
        XCTAssertEqual(Base64URL.encode([0xFB, 0xFF, 0xBF]), "-_-_")
        XCTAssertEqual(Base64URL.decode("-_-_"), [0xFB, 0xFF, 0xBF])
    }

    func testRoundTripsAgreeWithFoundationsBase64() {
        var generator = SystemRandomNumberGenerator()
        for count in 0..<200 {
            let bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let encoded = Base64URL.encode(bytes)
            let foundation = Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            XCTAssertEqual(encoded, foundation)
            XCTAssertEqual(Base64URL.decode(Substring(encoded)), bytes)
        }
    }

    /// The appending encoder (one reused buffer, as a DPoP proof is built) writes what `encode` returns, after
    /// whatever the buffer held, for every length remainder.
    func testAppendWritesWhatEncodeReturnsAfterTheExistingBytes() {
        for count in 0..<70 {
            let bytes = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 97 &+ 13) }
            var output = Array("prefix.".utf8)
            Base64URL.append(bytes, to: &output)
            XCTAssertEqual(String(decoding: output, as: UTF8.self), "prefix." + Base64URL.encode(bytes), "length \(count)")
        }
    }

    func testBadInputIsNil() {
        for bad in ["a", "abcde", "Zg==", "Zm8=", "Zm+v", "Zm/v", "Zm 9v", "Zm9v\n", "Zé", "Zm9v.", "%%%%"] {
            XCTAssertNil(Base64URL.decode(Substring(bad)), bad)
        }
        XCTAssertEqual(Base64URL.decode(""), [])
    }
}

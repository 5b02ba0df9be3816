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

    func testBadInputIsNil() {
        for bad in ["a", "abcde", "Zg==", "Zm8=", "Zm+v", "Zm/v", "Zm 9v", "Zm9v\n", "Zé", "Zm9v.", "%%%%"] {
            XCTAssertNil(Base64URL.decode(Substring(bad)), bad)
        }
        XCTAssertEqual(Base64URL.decode(""), [])
    }
}

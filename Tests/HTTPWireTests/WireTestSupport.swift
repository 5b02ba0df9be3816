import HTTPWire
import XCTest

/// A parsed head together with the bytes it points into.
struct ParsedRequest {
    var head: RequestHead
    var bytes: [UInt8]

    func text(_ range: Range<Int>) -> String { String(decoding: bytes[range], as: UTF8.self) }
    var target: String { text(head.target) }
    var method: String { text(head.methodBytes) }
    func values(_ name: String) -> [String] {
        head.fields.filter { text($0.name).lowercased() == name.lowercased() }.map { text($0.value) }
    }
}

struct ParsedResponse {
    var head: ResponseHead
    var bytes: [UInt8]
    func text(_ range: Range<Int>) -> String { String(decoding: bytes[range], as: UTF8.self) }
}

/// Parses `text` as one request head; nil if incomplete.
func parseRequest(_ text: String, limits: HTTPWireLimits = HTTPWireLimits()) throws -> ParsedRequest? {
    try parseRequest(Array(text.utf8), limits: limits)
}

func parseRequest(_ input: [UInt8], limits: HTTPWireLimits = HTTPWireLimits()) throws -> ParsedRequest? {
    var bytes = input
    var parser = HeadParser(limits: limits)
    var head = RequestHead()
    let done = try bytes.withUnsafeMutableBytes { buffer in try parser.parseRequest(buffer, into: &head) }
    return done ? ParsedRequest(head: head, bytes: bytes) : nil
}

func parseResponse(_ text: String, method: HTTPMethod = .get, limits: HTTPWireLimits = HTTPWireLimits()) throws -> ParsedResponse? {
    var bytes = Array(text.utf8)
    var parser = HeadParser(limits: limits)
    var head = ResponseHead()
    let done = try bytes.withUnsafeMutableBytes { buffer in
        try parser.parseResponse(buffer, requestMethod: method, into: &head)
    }
    return done ? ParsedResponse(head: head, bytes: bytes) : nil
}

func requestError(_ text: String, limits: HTTPWireLimits = HTTPWireLimits()) -> HTTPWireError? {
    do { _ = try parseRequest(text, limits: limits); return nil } catch let error as HTTPWireError { return error } catch { XCTFail("\(error)"); return nil }
}

func responseError(_ text: String, method: HTTPMethod = .get) -> HTTPWireError? {
    do { _ = try parseResponse(text, method: method); return nil } catch let error as HTTPWireError { return error } catch { XCTFail("\(error)"); return nil }
}

/// Decodes a whole chunked body; returns the data and how many bytes were consumed.
func decodeChunked(_ text: String, limits: HTTPWireLimits = HTTPWireLimits()) throws -> (body: String, consumed: Int, complete: Bool) {
    var decoder = ChunkedDecoder(limits: limits)
    var body: [UInt8] = []
    let bytes = Array(text.utf8)
    let consumed = try bytes.withUnsafeBytes { buffer in
        try decoder.decode(buffer) { body.append(contentsOf: $0) }
    }
    return (String(decoding: body, as: UTF8.self), consumed, decoder.isComplete)
}

func chunkedError(_ text: String) -> HTTPWireError? {
    do { _ = try decodeChunked(text); return nil } catch let error as HTTPWireError { return error } catch { XCTFail("\(error)"); return nil }
}

// libFuzzer entry for HTTPWire. Not part of the SwiftPM package: scripts/fuzz compiles this file together
// with Sources/HTTPWire/*.swift using `swiftc -sanitize=fuzzer,address`.
//
// Every input is read three ways (request head, response head, chunked body). Beyond "never crashes", it
// checks that results do not depend on how the bytes were split across reads, and that every offset
// handed out lies inside the head. `requestOutcome` is also what describe/main.swift prints for the
// differential test against another parser (scripts/fuzz).

#if canImport(Glibc)
import Glibc
#endif

@_cdecl("LLVMFuzzerTestOneInput")
public func httpWireFuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let whole = requestOutcome(input, splits: [])
    for split in splitPoints(size) {
        let pieces = requestOutcome(input, splits: [split])
        precondition(pieces == whole, "request result depends on the read split at \(split): \(whole) vs \(pieces)")
    }
    // Refusing an unfinished head early is safe: a refused prefix is never the start of a request the whole
    // input would be parsed as, and a longer prefix stays refused.
    var refusedFrom: Int?
    for end in splitPoints(size) + [size] {
        let refused = input.withUnsafeBytes { HeadParser.requestCannotBeHTTP(UnsafeRawBufferPointer(rebasing: $0[0..<end])) }
        if let from = refusedFrom, end > from { precondition(refused, "a refusal at \(from) bytes withdrawn at \(end)") }
        if refused {
            precondition(!whole.hasPrefix("ok"), "a head refused early at \(end) bytes parses as a request: \(whole)")
            refusedFrom = refusedFrom ?? end
        }
    }
    for method in [HTTPMethod.get, .head] {
        let w = responseOutcome(input, method: method, splits: [])
        for split in splitPoints(size) {
            precondition(responseOutcome(input, method: method, splits: [split]) == w, "response result depends on the split")
        }
    }
    let chunked = chunkedOutcome(input, split: nil)
    for split in splitPoints(size) {
        precondition(chunkedOutcome(input, split: split) == chunked, "chunked result depends on the split at \(split)")
    }
    return 0
}

private func splitPoints(_ size: Int) -> [Int] {
    size < 2 ? [] : [1, size / 2, size - 1]
}

/// One line: "incomplete", "error <case>", or "ok METHOD <target hex> <version> <framing> <head length> <fields>".
func requestOutcome(_ input: [UInt8], splits: [Int]) -> String {
    var bytes = input
    var parser = HeadParser()
    var head = RequestHead()
    do {
        var done = false
        for end in splits + [bytes.count] where !done {
            done = try bytes.withUnsafeMutableBytes { buffer in
                try parser.parseRequest(UnsafeMutableRawBufferPointer(rebasing: buffer[0..<end]), into: &head)
            }
        }
        guard done else { return "incomplete" }
        checkBounds(head.headLength, bytes.count, [head.methodBytes, head.target] + head.fields.flatMap { [$0.name, $0.value] })
        let method = String(decoding: bytes[head.methodBytes], as: UTF8.self)
        let target = bytes[head.target].map { byte in hex(byte) }.joined()
        let version = head.semantics.version == .http10 ? "1.0" : "1.1"
        return "ok \(method) \(target) \(version) \(describe(head.semantics.framing)) \(head.headLength) \(head.fields.count)"
    } catch {
        return "error \(error)"
    }
}

private func responseOutcome(_ input: [UInt8], method: HTTPMethod, splits: [Int]) -> String {
    var bytes = input
    var parser = HeadParser()
    var head = ResponseHead()
    do {
        var done = false
        for end in splits + [bytes.count] where !done {
            done = try bytes.withUnsafeMutableBytes { buffer in
                try parser.parseResponse(UnsafeMutableRawBufferPointer(rebasing: buffer[0..<end]), requestMethod: method, into: &head)
            }
        }
        guard done else { return "incomplete" }
        checkBounds(head.headLength, bytes.count, [head.reason] + head.fields.flatMap { [$0.name, $0.value] })
        return "ok \(head.status) \(describe(head.semantics.framing)) \(head.headLength) \(head.fields.count)"
    } catch {
        return "error \(error)"
    }
}

private func chunkedOutcome(_ input: [UInt8], split: Int?) -> String {
    var decoder = ChunkedDecoder()
    var body: [UInt8] = []
    var consumed = 0
    do {
        try input.withUnsafeBytes { buffer in
            let pieces = split.map { [0..<$0, $0..<buffer.count] } ?? [0..<buffer.count]
            for piece in pieces {
                let slice = UnsafeRawBufferPointer(rebasing: buffer[piece])
                let used = try decoder.decode(slice) { body.append(contentsOf: $0) }
                precondition(used <= slice.count)
                consumed += used
                if decoder.isComplete { break }
            }
        }
    } catch {
        return "error \(error)"
    }
    precondition(body.count <= consumed && consumed <= input.count)
    return "\(decoder.isComplete) \(consumed) \(body.count) \(body.hashValue)"
}

private func checkBounds(_ headLength: Int, _ count: Int, _ ranges: [Range<Int>]) {
    precondition(headLength > 0 && headLength <= count)
    for range in ranges { precondition(range.lowerBound >= 0 && range.upperBound <= headLength) }
}

private func describe(_ framing: BodyFraming) -> String {
    switch framing {
    case .none: return "none"
    case .length(let n): return "length:\(n)"
    case .chunked: return "chunked"
    case .untilClose: return "close"
    }
}

private func hex(_ byte: UInt8) -> String {
    let digits = Array("0123456789abcdef".utf8)
    return String(decoding: [digits[Int(byte >> 4)], digits[Int(byte & 15)]], as: UTF8.self)
}

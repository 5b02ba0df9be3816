/// Parses a token endpoint's JSON answer.
///
/// JSON allows numbers of any size (`"expires_in": 1e400`), and `JSONReader` refuses a document with one
/// that a Double cannot hold. Read as "not JSON", such an answer would be an unreadable 2xx: its rotated
/// refresh token lost, the old one burnt. So a number too large for a Double is read as the largest one
/// instead (lifetimes are clamped where they are read anyway), and only a document that is not JSON
/// fails.
enum TokenEndpointJSON {
    static func parse(_ body: [UInt8]) -> Any? {
        if let json = try? JSONReader.parse(body, fragmentsAllowed: true) { return json }
        guard let bounded = boundingNumbers(body) else { return nil }
        return try? JSONReader.parse(bounded, fragmentsAllowed: true)
    }

    /// `body` with every number literal outside strings whose exponent would overflow a Double replaced
    /// by ±1e308; nil when nothing needed replacing.
    static func boundingNumbers(_ body: [UInt8]) -> [UInt8]? {
        var result: [UInt8] = []
        result.reserveCapacity(body.count)
        var changed = false
        var index = 0
        var inString = false
        while index < body.count {
            let byte = body[index]
            if inString {
                result.append(byte)
                if byte == UInt8(ascii: "\\"), index + 1 < body.count {
                    result.append(body[index + 1])
                    index += 2
                    continue
                }
                if byte == UInt8(ascii: "\"") { inString = false }
                index += 1
                continue
            }
            if byte == UInt8(ascii: "\"") {
                inString = true
                result.append(byte)
                index += 1
                continue
            }
            guard byte == UInt8(ascii: "-") || (byte >= 0x30 && byte <= 0x39) else {
                result.append(byte)
                index += 1
                continue
            }
            var end = index + 1
            while end < body.count, "0123456789.eE+-".utf8.contains(body[end]) { end += 1 }
            let literal = body[index..<end]
            if let value = Double(String(decoding: literal, as: UTF8.self)), value.isInfinite {
                result.append(contentsOf: Array((value < 0 ? "-1e308" : "1e308").utf8))
                changed = true
            } else {
                result.append(contentsOf: literal)
            }
            index = end
        }
        return changed ? result : nil
    }
}

/// base64url without padding (RFC 4648 §5, as RFC 7515 §2 uses it).
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Appends base64url(`bytes`), no padding, to `output`: one capacity check and a pointer loop, for
    /// callers building a JWS in one reused buffer (a DPoP proof per request).
    public static func append(_ bytes: [UInt8], to output: inout [UInt8]) {
        let count = bytes.count
        let encoded = (count * 4 + 2) / 3
        let start = output.count
        output.append(contentsOf: repeatElement(0, count: encoded))
        bytes.withUnsafeBufferPointer { input in
            alphabet.withUnsafeBufferPointer { table in
                output.withUnsafeMutableBufferPointer { out in
                    var read = 0
                    var write = start
                    while read + 3 <= count {
                        let group = UInt32(input[read]) << 16 | UInt32(input[read + 1]) << 8 | UInt32(input[read + 2])
                        out[write] = table[Int(group >> 18 & 63)]
                        out[write + 1] = table[Int(group >> 12 & 63)]
                        out[write + 2] = table[Int(group >> 6 & 63)]
                        out[write + 3] = table[Int(group & 63)]
                        read += 3
                        write += 4
                    }
                    let rest = count - read
                    if rest > 0 {
                        let group = UInt32(input[read]) << 16 | (rest == 2 ? UInt32(input[read + 1]) << 8 : 0)
                        out[write] = table[Int(group >> 18 & 63)]
                        out[write + 1] = table[Int(group >> 12 & 63)]
                        if rest == 2 { out[write + 2] = table[Int(group >> 6 & 63)] }
                    }
                }
            }
        }
    }

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            out.append(alphabet[Int(group >> 18 & 63)])
            out.append(alphabet[Int(group >> 12 & 63)])
            out.append(alphabet[Int(group >> 6 & 63)])
            out.append(alphabet[Int(group & 63)])
            index += 3
        }
        let rest = bytes.count - index
        if rest > 0 {
            let group = UInt32(bytes[index]) << 16 | (rest == 2 ? UInt32(bytes[index + 1]) << 8 : 0)
            out.append(alphabet[Int(group >> 18 & 63)])
            out.append(alphabet[Int(group >> 12 & 63)])
            if rest == 2 { out.append(alphabet[Int(group >> 6 & 63)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// nil for a character outside the url-safe alphabet (padding `=`, whitespace, `+` and `/` included)
    /// or a length that no byte string encodes to (4n + 1). Unused low bits of the last character are
    /// ignored, as most decoders do (a JWT from elsewhere is read, not re-verified, through this).
    public static func decode(_ text: Substring) -> [UInt8]? {
        let utf8 = text.utf8
        if utf8.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count * 3 / 4)
        var group: UInt32 = 0
        var filled = 0
        for character in utf8 {
            guard let value = sextet(character) else { return nil }
            group = group << 6 | UInt32(value)
            filled += 1
            if filled == 4 {
                out.append(UInt8(group >> 16 & 0xFF))
                out.append(UInt8(group >> 8 & 0xFF))
                out.append(UInt8(group & 0xFF))
                group = 0
                filled = 0
            }
        }
        if filled == 2 {
            out.append(UInt8(group >> 4 & 0xFF))
        } else if filled == 3 {
            out.append(UInt8(group >> 10 & 0xFF))
            out.append(UInt8(group >> 2 & 0xFF))
        }
        return out
    }

    private static func sextet(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): character - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): character - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character - UInt8(ascii: "0") + 52
        case UInt8(ascii: "-"): 62
        case UInt8(ascii: "_"): 63
        default: nil
        }
    }
}

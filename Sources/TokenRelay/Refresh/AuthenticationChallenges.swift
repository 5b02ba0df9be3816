/// Reads `WWW-Authenticate` field values as challenges: an auth-scheme, then its auth-params
/// (`name = token` or `name = "quoted string"`) or a token68, challenges separated by commas.
///
/// Only as far as the refresh rules need: one parameter of one scheme. A scheme's name inside a quoted value
/// (`realm="bearer-api"`, a description saying "DPoP") is text: it neither starts a challenge nor ends the one
/// it is in, so a nonce challenge is not taken for a Bearer one or the other way round.
enum AuthenticationChallenges {
    /// The value of parameter `name` of the first challenge with auth-scheme `scheme` (both without ASCII
    /// case) that has a non-empty one, across `fieldValues` in order; nil when none has.
    static func parameter(_ name: String, ofScheme scheme: String, in fieldValues: [String]) -> String? {
        let wantedScheme = Array(scheme.utf8).map(lowercased), wantedName = Array(name.utf8).map(lowercased)
        for value in fieldValues {
            if let found = parameter(wantedName, ofScheme: wantedScheme, in: Array(value.utf8)) { return found }
        }
        return nil
    }

    /// One field value, scanned once: every step consumes at least one byte, so any input ends.
    private static func parameter(_ name: [UInt8], ofScheme scheme: [UInt8], in bytes: [UInt8]) -> String? {
        var index = 0
        var inWantedScheme = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                _ = quotedString(bytes, &index)   // stray quoted text: skipped whole
                continue
            }
            guard isWordByte(byte) else {
                index += 1   // separators (space, tab, comma) and anything out of place
                continue
            }
            let word = readWord(bytes, &index)
            var look = index
            skipSpaces(bytes, &look)
            guard look < bytes.count, bytes[look] == UInt8(ascii: "=") else {
                // A word not followed by "=" starts a challenge (a token68 lands here too, as a name that
                // matches no scheme asked for).
                inWantedScheme = word.map(lowercased) == scheme
                continue
            }
            index = look + 1
            skipSpaces(bytes, &index)
            let value: String?
            if index < bytes.count, bytes[index] == UInt8(ascii: "\"") {
                value = quotedString(bytes, &index)
            } else {
                value = String(decoding: readWord(bytes, &index), as: UTF8.self)
            }
            if inWantedScheme, word.map(lowercased) == name, let value, !value.isEmpty { return value }
        }
        return nil
    }

    /// token characters (RFC 9110 §5.6.2) and "/" (token68's): a scheme, a parameter name or a bare value.
    private static func isWordByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        default: "!#$%&'*+-.^_`|~/".utf8.contains(byte)
        }
    }

    private static func readWord(_ bytes: [UInt8], _ index: inout Int) -> ArraySlice<UInt8> {
        let start = index
        while index < bytes.count, isWordByte(bytes[index]) { index += 1 }
        return bytes[start..<index]
    }

    private static func skipSpaces(_ bytes: [UInt8], _ index: inout Int) {
        while index < bytes.count, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\t") { index += 1 }
    }

    /// The quoted string starting at `index` (a quote), unescaped; `index` ends after its closing quote.
    /// nil when it is not closed (then everything up to the end is consumed).
    private static func quotedString(_ bytes: [UInt8], _ index: inout Int) -> String? {
        var text: [UInt8] = []
        index += 1
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            if byte == UInt8(ascii: "\"") { return String(decoding: text, as: UTF8.self) }
            if byte == UInt8(ascii: "\\"), index < bytes.count {
                text.append(bytes[index])
                index += 1
            } else {
                text.append(byte)
            }
        }
        return nil
    }

    private static func lowercased(_ byte: UInt8) -> UInt8 {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte + 32 : byte
    }
}

/// The two trims Foundation's `trimmingCharacters(in:)` gave us, on Unicode scalars as it does.
extension StringProtocol {
    /// `CharacterSet.whitespaces`: tab and the space separators (general category Zs).
    func trimmingWhitespace() -> String {
        trimmingScalars { $0 == "\t" || $0.properties.generalCategory == .spaceSeparator }
    }

    /// `CharacterSet.newlines`: U+000A–U+000D, U+0085, U+2028, U+2029.
    func trimmingNewlines() -> String {
        trimmingScalars { (0x0A...0x0D).contains($0.value) || $0.value == 0x85 || $0.value == 0x2028 || $0.value == 0x2029 }
    }

    private func trimmingScalars(where isTrimmed: (Unicode.Scalar) -> Bool) -> String {
        let scalars = String(self).unicodeScalars
        guard let first = scalars.firstIndex(where: { !isTrimmed($0) }),
              let last = scalars.lastIndex(where: { !isTrimmed($0) }) else { return "" }
        return String(String.UnicodeScalarView(scalars[first...last]))
    }
}

extension String {
    /// The range of the first ASCII-case-insensitive occurrence of `needle` (itself ASCII), e.g. an
    /// auth-scheme name in a header value.
    func rangeIgnoringASCIICase(of needle: String) -> Range<String.Index>? {
        let wanted = Array(needle.utf8).map(Self.asciiLowercase)
        guard !wanted.isEmpty else { return startIndex..<startIndex }
        var start = utf8.startIndex
        while start != utf8.endIndex {
            var candidate = start
            var matched = 0
            while matched < wanted.count, candidate != utf8.endIndex, Self.asciiLowercase(utf8[candidate]) == wanted[matched] {
                matched += 1
                candidate = utf8.index(after: candidate)
            }
            if matched == wanted.count { return start..<candidate }
            start = utf8.index(after: start)
        }
        return nil
    }

    private static func asciiLowercase(_ byte: UInt8) -> UInt8 {
        byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte + 0x20 : byte
    }
}

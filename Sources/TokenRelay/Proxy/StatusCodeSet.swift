/// A set of HTTP status codes (0-639) as bits: a membership test per response without hashing.
struct StatusCodeSet {
    private var words = (UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0),
                         UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0))
    private static let limit = 640

    init() {}

    /// Codes outside 0-639 are left out (the config allows 400-499 only).
    init(_ codes: some Sequence<Int>) {
        for code in codes where (0..<Self.limit).contains(code) {
            withUnsafeMutableBytes(of: &words) { raw in
                let bits = raw.bindMemory(to: UInt64.self)
                bits[code >> 6] |= 1 << UInt64(code & 63)
            }
        }
    }

    func contains(_ code: Int) -> Bool {
        guard (0..<Self.limit).contains(code) else { return false }
        return withUnsafeBytes(of: words) { raw in
            raw.load(fromByteOffset: (code >> 6) * 8, as: UInt64.self) & (1 << UInt64(code & 63)) != 0
        }
    }
}

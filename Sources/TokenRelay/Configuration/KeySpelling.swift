/// Whether a config key looks like a misspelling of another: one character inserted, deleted or
/// replaced, or two neighbours swapped (`clinet_id` and `client_id`), the mistakes fingers make; or the
/// same words in another case style (`clientId`, `Client-ID`), the mistake other tools' configs teach.
enum KeySpelling {
    static func isLikelyMisspelling(_ typed: String, of known: String) -> Bool {
        isOneEditAway(typed, known) || (typed != known && normalized(typed) == normalized(known))
    }

    private static func normalized(_ key: String) -> String {
        String(key.lowercased().filter { $0 != "_" && $0 != "-" })
    }

    static func isOneEditAway(_ typed: String, _ known: String) -> Bool {
        let a = Array(typed.utf8), b = Array(known.utf8)
        guard a != b, abs(a.count - b.count) <= 1 else { return false }
        let prefix = zip(a, b).prefix { $0 == $1 }.count
        if a.count == b.count {
            // Same length: one replacement, or an adjacent swap.
            if a[(prefix + 1)...] == b[(prefix + 1)...] { return true }
            return prefix + 1 < a.count && a[prefix] == b[prefix + 1] && a[prefix + 1] == b[prefix]
                && a[(prefix + 2)...] == b[(prefix + 2)...]
        }
        // One character more on one side: skipping it there leaves the rest equal.
        let (longer, shorter) = a.count > b.count ? (a, b) : (b, a)
        return longer[(prefix + 1)...] == shorter[prefix...]
    }
}

/// Reads one JSON object of the config, field by field, so every error can name its path and every key
/// nobody asked for is reported (`refresh.clinet_id: unknown key`): a typo must never silently switch a
/// setting back to its default.
final class JSONObjectReader {
    let path: String
    private let object: [String: Any]
    private var consumed: Set<String> = []
    /// Every key this object may have (`declareKeys`), or nil when not declared.
    private var declared: Set<String>?

    init(_ value: Any, path: String) throws {
        guard let object = value as? [String: Any] else {
            throw ConfigError(path, "must be a JSON object")
        }
        self.object = object
        self.path = path
    }

    /// Declares every key this object may have. Objects with required keys declare them, so that an
    /// unknown key is named before a missing one: reading stops at the first missing key, before the keys
    /// read after it are known, and an operator who misspelt a key should hear about the misspelling, not
    /// about the key it was meant to be. Debug builds check that nothing outside the list is read.
    func declareKeys(_ keys: [String]) {
        declared = Set(keys)
    }

    func fieldPath(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    func has(_ key: String) -> Bool { object[key] != nil }

    /// Every key of this object, sorted (for maps whose keys are data, such as header names).
    var keys: [String] { object.keys.sorted() }

    /// Any JSON value (nil when absent or null), for free-form parts such as a request body template.
    func optionalValue(_ key: String) -> Any? { take(key) }

    private func take(_ key: String) -> Any? {
        consumed.insert(key)
        guard let value = object[key], !(value is JSONNull) else { return nil }
        return value
    }

    func optionalString(_ key: String) throws -> String? {
        guard let value = take(key) else { return nil }
        guard let string = value as? String else { throw ConfigError(fieldPath(key), "must be a string") }
        guard !string.isEmpty else { throw ConfigError(fieldPath(key), "must not be empty") }
        return string
    }

    func string(_ key: String) throws -> String {
        guard let value = try optionalString(key) else { throw missing(key) }
        return value
    }

    func optionalNumber(_ key: String, range: ClosedRange<Double>) throws -> Double? {
        guard let value = take(key) else { return nil }
        guard let number = value as? JSONNumber else {
            throw ConfigError(fieldPath(key), "must be a number")
        }
        let double = number.doubleValue
        guard range.contains(double) else {
            throw ConfigError(fieldPath(key), "must be between \(format(range.lowerBound)) and \(format(range.upperBound))")
        }
        return double
    }

    func optionalInteger(_ key: String, range: ClosedRange<Int>) throws -> Int? {
        guard let double = try optionalNumber(key, range: Double(range.lowerBound)...Double(range.upperBound)) else { return nil }
        guard double == double.rounded() else { throw ConfigError(fieldPath(key), "must be a whole number") }
        return Int(double)
    }

    func optionalBool(_ key: String) throws -> Bool? {
        guard let value = take(key) else { return nil }
        guard let flag = value as? Bool else {
            throw ConfigError(fieldPath(key), "must be true or false")
        }
        return flag
    }

    func optionalIntegerArray(_ key: String, range: ClosedRange<Int>) throws -> [Int]? {
        guard let value = take(key) else { return nil }
        guard let array = value as? [Any] else { throw ConfigError(fieldPath(key), "must be an array of numbers") }
        return try array.enumerated().map { index, element in
            guard let number = element as? JSONNumber, number.doubleValue == number.doubleValue.rounded(),
                  range.contains(number.intValue) else {
                throw ConfigError("\(fieldPath(key))[\(index)]", "must be a whole number between \(range.lowerBound) and \(range.upperBound)")
            }
            return number.intValue
        }
    }

    func optionalStringArray(_ key: String) throws -> [String]? {
        guard let value = take(key) else { return nil }
        guard let array = value as? [Any] else { throw ConfigError(fieldPath(key), "must be an array of strings") }
        return try array.enumerated().map { index, element in
            guard let string = element as? String, !string.isEmpty else {
                throw ConfigError("\(fieldPath(key))[\(index)]", "must be a non-empty string")
            }
            return string
        }
    }

    func optionalObject(_ key: String) throws -> JSONObjectReader? {
        guard let value = take(key) else { return nil }
        return try JSONObjectReader(value, path: fieldPath(key))
    }

    func object(_ key: String) throws -> JSONObjectReader {
        guard let reader = try optionalObject(key) else { throw missing(key) }
        return reader
    }

    /// Call after reading every known key. Every key asked for counts as known, present or not, so a
    /// misspelt optional key gets the right spelling suggested.
    func rejectUnknownKeys() throws {
        assert(declared.map(consumed.isSubset) ?? true, "\(path): read a key missing from declareKeys: \(consumed.subtracting(declared ?? []))")
        if let unknown = object.keys.sorted().first(where: { !consumed.contains($0) }) {
            throw unknownKey(unknown, suggesting: suggestion(for: unknown, among: consumed.union(declared ?? [])))
        }
    }

    private func suggestion(for unknown: String, among known: Set<String>) -> String? {
        known.sorted().first { KeySpelling.isLikelyMisspelling(unknown, of: $0) }
    }

    /// A required key is absent. A key of this object that looks like a misspelling of it (one edit away,
    /// or another case style) and that nobody has asked for is the likelier mistake, and so is, in an
    /// object that declared its keys, any key outside the declaration (`clinet_id` for `client_id`): the typo is named, not the missing key, so
    /// the operator fixes the line they wrote instead of adding a second one.
    func missing(_ key: String) -> ConfigError {
        let typo = object.keys.sorted().first { !consumed.contains($0) && KeySpelling.isLikelyMisspelling($0, of: key) }
        if let typo, !(declared?.contains(typo) ?? false) { return unknownKey(typo, suggesting: key) }
        if let declared, let unknown = object.keys.sorted().first(where: { !declared.contains($0) }) {
            return unknownKey(unknown, suggesting: suggestion(for: unknown, among: declared))
        }
        return ConfigError(fieldPath(key), "is required")
    }

    private func unknownKey(_ key: String, suggesting known: String?) -> ConfigError {
        ConfigError(fieldPath(key), known.map { "unknown key (did you mean \($0)?)" } ?? "unknown key")
    }

    private func format(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }
}

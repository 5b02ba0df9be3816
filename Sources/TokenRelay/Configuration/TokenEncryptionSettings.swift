/// `tokens.encryption`: the token state is stored sealed (AES-256-GCM) with the key in `key_file` (or the
/// environment variable `key_env`); a state sealed with one of `previous_key_files` is still read, and
/// rewritten with the current key (rotation without a login).
public struct TokenEncryptionSettings: Sendable, Equatable {
    public enum KeySource: Sendable, Equatable {
        case file(String)
        case environment(String)
    }

    public var key: KeySource
    public var previousKeyFiles: [String] = []
    /// Where the settings are in the config (`tokens.encryption`, or an identity's), for error lines.
    var path = "tokens.encryption"

    /// The field a problem with the current key is reported under.
    var keyField: String {
        switch key {
        case .file: return "\(path).key_file"
        case .environment: return "\(path).key_env"
        }
    }

    /// Where the keys come from, for the restart notice of a reload (paths and names only, never a key).
    var description: String {
        let current: String
        switch key {
        case .file(let path): current = "key_file \(path)"
        case .environment(let name): current = "key_env \(name)"
        }
        return previousKeyFiles.isEmpty ? current : "\(current) previous_key_files \(previousKeyFiles.joined(separator: ","))"
    }

    static func read(from tokens: JSONObjectReader) throws -> TokenEncryptionSettings? {
        guard let object = try tokens.optionalObject("encryption") else { return nil }
        object.declareKeys(["key_file", "key_env", "previous_key_files"])
        let file = try object.optionalString("key_file")
        let environment = try object.optionalString("key_env")
        let key: KeySource
        switch (file, environment) {
        case (let path?, nil): key = .file(path)
        case (nil, let name?): key = .environment(name)
        case (_?, _?): throw ConfigError(object.fieldPath("key_file"), "give either key_file or key_env, not both")
        case (nil, nil): throw ConfigError(object.fieldPath("key_file"), "is required (or \(object.fieldPath("key_env")))")
        }
        var settings = TokenEncryptionSettings(key: key)
        settings.path = tokens.fieldPath("encryption")
        settings.previousKeyFiles = try object.optionalStringArray("previous_key_files") ?? []
        try object.rejectUnknownKeys()
        return settings
    }
}

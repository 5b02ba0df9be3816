import JOSE

/// `dpop` (RFC 9449): its presence turns proofs on. `alg` ES256 unless named; `key_file` a PEM private key,
/// or none: a key is generated at the first start and kept with the token state.
public struct DPoPSettings: Sendable, Equatable {
    public var alg: JWSAlgorithm = .ES256
    public var keyFile: String?

    static func read(from root: JSONObjectReader) throws -> DPoPSettings? {
        guard let object = try root.optionalObject("dpop") else { return nil }
        object.declareKeys(["alg", "key_file"])
        var settings = DPoPSettings()
        if let alg = try object.optionalString("alg") {
            guard let parsed = JWSAlgorithm(rawValue: alg) else {
                throw ConfigError(object.fieldPath("alg"), "must be one of \(JWSAlgorithm.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            settings.alg = parsed
        }
        if let file = try object.optionalString("key_file") {
            guard !file.isEmpty else { throw ConfigError(object.fieldPath("key_file"), "must not be empty") }
            settings.keyFile = file
        }
        try object.rejectUnknownKeys()
        return settings
    }
}

import JOSE

/// Reads what private_key_jwt, jwt_bearer and token_exchange add to the `refresh` object. Each key is
/// refused with its path where it cannot apply, so a key meant for one method never sits unused.
extension ConfigLoader {
    static let clientAssertionKeys = ["client_key_file", "client_key_id", "client_key_certificate_file", "client_assertion_alg",
                                      "client_assertion_audience", "client_assertion_file"]
    static let tokenExchangeKeys = ["subject_token_file", "subject_token_type", "actor_token_file", "actor_token_type",
                                    "requested_token_type"]

    /// private_key_jwt: exactly one of `client_key_file` (signed here) and `client_assertion_file` (ready-made).
    static func readClientAssertion(_ object: JSONObjectReader, tokenURL: String) throws -> ClientAssertionSource {
        switch (try object.optionalString("client_key_file"), try object.optionalString("client_assertion_file")) {
        case (nil, nil):
            throw ConfigError(object.fieldPath("client_key_file"), "client_auth private_key_jwt needs client_key_file or client_assertion_file")
        case (_?, _?):
            throw ConfigError(object.fieldPath("client_assertion_file"), "set either client_key_file or client_assertion_file, not both")
        case (nil, let file?):
            for key in ["client_key_id", "client_key_certificate_file", "client_assertion_alg", "client_assertion_audience"] where object.has(key) {
                throw ConfigError(object.fieldPath(key), "only applies to an assertion signed with client_key_file, not to client_assertion_file")
            }
            return .file(file)
        case (let keyFile?, nil):
            return .signed(SignedAssertionSettings(
                keyFile: keyFile, keyField: object.fieldPath("client_key_file"), keyID: try object.optionalString("client_key_id"),
                certificateFile: try object.optionalString("client_key_certificate_file"), algorithm: try algorithm(object, "client_assertion_alg"), algorithmField: object.fieldPath("client_assertion_alg"),
                audience: try object.optionalString("client_assertion_audience") ?? tokenURL))
        }
    }

    /// The jwt_bearer grant's `refresh.assertion`: `{file}` alone, or what to sign.
    static func readAssertionGrant(_ object: JSONObjectReader, tokenURL: String) throws -> AssertionGrantSettings {
        object.declareKeys(["file", "key_file", "key_id", "alg", "issuer", "subject", "audience", "lifetime_seconds", "claims"])
        if let file = try object.optionalString("file") {
            for key in ["key_file", "key_id", "alg", "issuer", "subject", "audience", "lifetime_seconds", "claims"] where object.has(key) {
                throw ConfigError(object.fieldPath(key), "does not apply to a ready-made assertion (file)")
            }
            try object.rejectUnknownKeys()
            return .file(file)
        }
        guard object.has("key_file") else { throw ConfigError(object.fieldPath("key_file"), "is required (or file, for a ready-made assertion)") }
        let signing = SignedAssertionSettings(
            keyFile: try object.string("key_file"), keyField: object.fieldPath("key_file"), keyID: try object.optionalString("key_id"),
            certificateFile: nil, algorithm: try algorithm(object, "alg"), algorithmField: object.fieldPath("alg"),
            audience: try object.optionalString("audience") ?? tokenURL)
        let issuer = try object.string("issuer")
        let subject = try object.string("subject")
        // RFC 7523 §3 wants a short life; a day is the outside of anything an IdP accepts.
        let lifetime = try object.optionalInteger("lifetime_seconds", range: 1...86_400) ?? 300
        let claims = try extraClaims(object)
        try object.rejectUnknownKeys()
        return .signed(signing, issuer: issuer, subject: subject, lifetimeSeconds: lifetime, extraClaims: claims)
    }

    /// token_exchange: the subject token's file and type, the optional actor token, the type asked for.
    static func readTokenExchange(_ object: JSONObjectReader) throws -> TokenExchangeSettings {
        var settings = TokenExchangeSettings(subjectTokenFile: try object.string("subject_token_file"))
        if let type = try object.optionalString("subject_token_type") { settings.subjectTokenType = type }
        settings.actorTokenFile = try object.optionalString("actor_token_file")
        settings.actorTokenType = try object.optionalString("actor_token_type")
        if settings.actorTokenFile == nil, settings.actorTokenType != nil {
            throw ConfigError(object.fieldPath("actor_token_type"), "needs actor_token_file")
        }
        if settings.actorTokenFile != nil, settings.actorTokenType == nil { settings.actorTokenType = TokenExchangeSettings.jwtTokenType }
        settings.requestedTokenType = try object.optionalString("requested_token_type")
        return settings
    }

    private static func algorithm(_ object: JSONObjectReader, _ key: String) throws -> JWSAlgorithm? {
        guard let text = try object.optionalString(key) else { return nil }
        guard let alg = JWSAlgorithm(rawValue: text) else {
            throw ConfigError(object.fieldPath(key), "must be one of \(JWSAlgorithm.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return alg
    }

    /// The claims tokenrelay sets itself cannot be overridden here: a second `exp` would outlive the
    /// configured lifetime, and a fixed `jti` would be refused as a replay on the second request.
    private static func extraClaims(_ object: JSONObjectReader) throws -> ExtraClaims {
        guard let claims = object.optionalValue("claims") else { return .none }
        guard let members = claims as? [String: Any] else { throw ConfigError(object.fieldPath("claims"), "must be a JSON object") }
        let owned: [String: String] = ["iss": "issuer", "sub": "subject", "aud": "audience", "exp": "lifetime_seconds", "iat": "", "jti": ""]
        if let taken = members.keys.sorted().first(where: { owned[$0] != nil }) {
            let instead = owned[taken].map { $0.isEmpty ? "" : " (use \($0))" } ?? ""
            throw ConfigError(object.fieldPath("claims.\(taken)"), "is set by tokenrelay\(instead)")
        }
        guard let json = try? JSONWriter.string(members, options: [.sortedKeys, .withoutEscapingSlashes]) else {
            throw ConfigError(object.fieldPath("claims"), "cannot be written as JSON")
        }
        return ExtraClaims(json: json)
    }
}

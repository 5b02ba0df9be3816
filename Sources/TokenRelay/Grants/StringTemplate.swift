import FoundationEssentials

/// A configured string with `{{placeholder}}`s (`"Bearer {{refresh_token}}"`), parsed at start so that an
/// unknown or unterminated placeholder is a config error naming the field. Rendering only ever substitutes
/// values; escaping for where the result goes (JSON, form, header) is the caller's job, done on the
/// rendered string by a real encoder.
public struct StringTemplate: Sendable, Equatable {
    public enum Placeholder: String, Sendable, CaseIterable {
        case refreshToken = "refresh_token"
        case accessToken = "access_token"
        case clientID = "client_id"
        case clientSecret = "client_secret"
    }

    enum Part: Sendable, Equatable {
        case literal(String)
        case placeholder(Placeholder)
    }

    let parts: [Part]

    public var placeholders: Set<Placeholder> {
        Set(parts.compactMap { if case .placeholder(let name) = $0 { name } else { nil } })
    }

    init(parsing text: String, field: String) throws {
        var parts: [Part] = []
        var rest = Substring(text)
        while let open = rest.firstRange(of: "{{") {
            if open.lowerBound > rest.startIndex { parts.append(.literal(String(rest[..<open.lowerBound]))) }
            guard let close = rest[open.upperBound...].firstRange(of: "}}") else {
                throw ConfigError(field, "has {{ without a closing }}")
            }
            let name = rest[open.upperBound..<close.lowerBound].trimmingWhitespace()
            guard let placeholder = Placeholder(rawValue: name) else {
                let known = Placeholder.allCases.map { "{{\($0.rawValue)}}" }.joined(separator: ", ")
                throw ConfigError(field, "unknown placeholder {{\(name)}} (known: \(known))")
            }
            parts.append(.placeholder(placeholder))
            rest = rest[close.upperBound...]
        }
        if !rest.isEmpty { parts.append(.literal(String(rest))) }
        self.parts = parts
    }

    /// Substitutes every placeholder; a value that is not available renders as the empty string (the
    /// config check makes sure client id and secret exist when referenced).
    func render(_ values: [Placeholder: String]) -> String {
        parts.map { part in
            switch part {
            case .literal(let text): text
            case .placeholder(let name): values[name] ?? ""
            }
        }.joined()
    }
}

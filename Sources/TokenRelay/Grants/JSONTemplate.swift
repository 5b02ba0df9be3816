/// A JSON request body from the config in which every string value may hold placeholders. It is rendered
/// into a JSON tree and serialised by `JSONWriter`, so a token with a quote or backslash
/// is escaped as JSON requires instead of breaking (or rewriting) the document.
public indirect enum JSONTemplate: Sendable, Equatable {
    case object([String: JSONTemplate])
    case array([JSONTemplate])
    case string(StringTemplate)
    case integer(Int)
    case number(Double)
    case bool(Bool)
    case null

    /// Parses a `JSONReader` value; `field` names it in errors (`refresh.request.body_json.data.token`).
    static func parse(_ value: Any, field: String) throws -> JSONTemplate {
        switch value {
        case let object as [String: Any]:
            var members: [String: JSONTemplate] = [:]
            for (key, member) in object {
                guard !key.contains("{{") else { throw ConfigError("\(field).\(key)", "placeholders are allowed in string values only, not in keys") }
                members[key] = try parse(member, field: "\(field).\(key)")
            }
            return .object(members)
        case let array as [Any]:
            return .array(try array.enumerated().map { try parse($0.element, field: "\(field)[\($0.offset)]") })
        case let string as String:
            return .string(try StringTemplate(parsing: string, field: field))
        case let flag as Bool:
            return .bool(flag)
        case let number as JSONNumber:
            let double = number.doubleValue
            if double == double.rounded(), abs(double) < 1e15 { return .integer(number.intValue) }
            return .number(double)
        case is JSONNull:
            return .null
        default:
            throw ConfigError(field, "is not a JSON value")
        }
    }

    var placeholders: Set<StringTemplate.Placeholder> {
        switch self {
        case .object(let members): members.values.reduce(into: []) { $0.formUnion($1.placeholders) }
        case .array(let elements): elements.reduce(into: []) { $0.formUnion($1.placeholders) }
        case .string(let template): template.placeholders
        case .integer, .number, .bool, .null: []
        }
    }

    func render(_ values: [StringTemplate.Placeholder: String]) -> Any {
        switch self {
        case .object(let members): members.mapValues { $0.render(values) }
        case .array(let elements): elements.map { $0.render(values) }
        case .string(let template): template.render(values)
        case .integer(let value): value
        case .number(let value): value
        case .bool(let value): value
        case .null: JSONNull()
        }
    }
}

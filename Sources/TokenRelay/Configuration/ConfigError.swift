/// A configuration problem, always naming the field (a JSON path such as `refresh.client_id`) and why.
public struct ConfigError: Error, CustomStringConvertible, Equatable {
    public let field: String
    public let reason: String

    public init(_ field: String, _ reason: String) {
        self.field = field
        self.reason = reason
    }

    public var description: String { field.isEmpty ? reason : "\(field): \(reason)" }
}

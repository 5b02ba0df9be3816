import FoundationEssentials
import Glibc
import Logging

public enum LogFormat: String, Sendable {
    /// logfmt: `ts=2026-11-21T10:00:00.123Z level=info msg="refresh succeeded" generation=3`
    case text
    /// One JSON object per line: `{"ts":"…","level":"info","msg":"refresh succeeded","generation":"3"}`
    case json
}

/// swift-log handler writing one line per event to stderr, as logfmt or JSON.
///
/// It writes with `write(2)` (Swift 6 forbids touching the global `stderr`), runs every line through the
/// `SecretRedactor` whatever the format, and escapes values so that a hostile string cannot forge extra
/// log lines or fields.
public struct LineLogHandler: LogHandler {
    /// Shared by every copy of the handler (`LogLevelControl`): setting it changes the level process-wide.
    public var logLevel: Logger.Level {
        get { levelControl.current }
        nonmutating set { levelControl.current = newValue }
    }
    public var metadata: Logger.Metadata = [:]
    private let format: LogFormat
    private let redactor: SecretRedactor
    private let levelControl: LogLevelControl

    public init(level: Logger.Level, format: LogFormat = .text, redactor: SecretRedactor) {
        self.init(levelControl: LogLevelControl(level), format: format, redactor: redactor)
    }

    public init(levelControl: LogLevelControl, format: LogFormat = .text, redactor: SecretRedactor) {
        self.levelControl = levelControl
        self.format = format
        self.redactor = redactor
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        let line = render(level: event.level, message: event.message.description, metadata: merged) + "\n"
        var bytes = line
        bytes.withUTF8 { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = Glibc.write(2, buffer.baseAddress! + offset, buffer.count - offset)
                if written <= 0 { return }
                offset += written
            }
        }
    }

    /// One log line without the newline. Values are redacted before escaping: escaping would turn a
    /// secret containing `"` or `\` into text the redactor no longer recognises.
    func render(level: Logger.Level, message: String, metadata: Logger.Metadata) -> String {
        let fields = [("ts", Self.timestamp()), ("level", "\(level)"), ("msg", redactor.redact(message))]
            + metadata.keys.sorted().map { ($0, redactor.redact(metadata[$0]!.description)) }
        return format == .json ? Self.json(fields) : Self.logfmt(fields)
    }

    static func logfmt(_ fields: [(String, String)]) -> String {
        fields.map { "\($0.0)=\(quote($0.1))" }.joined(separator: " ")
    }

    static func json(_ fields: [(String, String)]) -> String {
        "{" + fields.map { "\(jsonString($0.0)):\(jsonString($0.1))" }.joined(separator: ",") + "}"
    }

    static func quote(_ value: String) -> String {
        let needsQuotes = value.isEmpty || value.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0.asciiValue.map { $0 < 0x20 } ?? false }
        return needsQuotes ? jsonString(value) : value
    }

    /// A JSON string literal; logfmt quoting uses the same escapes.
    static func jsonString(_ value: String) -> String {
        var escaped = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    escaped += cFormat("\\u%04x", scalar.value)
                } else {
                    escaped.unicodeScalars.append(scalar)
                }
            }
        }
        return escaped + "\""
    }

    private static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var tmValue = tm()
        var seconds = ts.tv_sec
        gmtime_r(&seconds, &tmValue)
        return cFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tmValue.tm_year + 1900, tmValue.tm_mon + 1, tmValue.tm_mday,
                      tmValue.tm_hour, tmValue.tm_min, tmValue.tm_sec, Int32(ts.tv_nsec / 1_000_000))
    }
}

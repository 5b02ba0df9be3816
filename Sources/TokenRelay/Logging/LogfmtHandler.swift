import Foundation
import Glibc
import Logging

/// swift-log handler writing one logfmt line per event to stderr:
/// `ts=2026-11-21T10:00:00.123Z level=info msg="refresh succeeded" generation=3`.
///
/// It writes with `write(2)` (Swift 6 forbids touching the global `stderr`), runs every line through the
/// `SecretRedactor`, and escapes values so that a hostile string cannot forge extra log lines.
public struct LogfmtHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    private let redactor: SecretRedactor

    public init(level: Logger.Level, redactor: SecretRedactor) {
        self.logLevel = level
        self.redactor = redactor
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var line = "ts=\(Self.timestamp()) level=\(event.level) msg=\(Self.quote(event.message.description))"
        let merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        for key in merged.keys.sorted() {
            line += " \(key)=\(Self.quote(merged[key]!.description))"
        }
        line = redactor.redact(line) + "\n"
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = Glibc.write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if written <= 0 { return }
                offset += written
            }
        }
    }

    static func quote(_ value: String) -> String {
        let needsQuotes = value.isEmpty || value.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0.asciiValue.map { $0 < 0x20 } ?? false }
        guard needsQuotes else { return value }
        var escaped = ""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    escaped += String(format: "\\u%04x", scalar.value)
                } else {
                    escaped.unicodeScalars.append(scalar)
                }
            }
        }
        return "\"\(escaped)\""
    }

    private static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var tmValue = tm()
        var seconds = ts.tv_sec
        gmtime_r(&seconds, &tmValue)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tmValue.tm_year + 1900, tmValue.tm_mon + 1, tmValue.tm_mday,
                      tmValue.tm_hour, tmValue.tm_min, tmValue.tm_sec, ts.tv_nsec / 1_000_000)
    }
}

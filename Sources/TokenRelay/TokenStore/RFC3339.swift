import FoundationEssentials

/// RFC 3339 timestamps (`2026-11-23T23:17:59Z`, `…59.250+01:00`) as the token file and the in-flight
/// record use them: read with or without fractional seconds and with any offset, written in UTC.
enum RFC3339 {
    /// Whole seconds: `2026-11-23T23:17:59Z`.
    static func format(_ date: Date) -> String {
        let seconds = date.timeIntervalSince1970.rounded(.down)
        return format(fields: CivilTime.fields(epochSeconds: Int(seconds)), fraction: nil)
    }

    /// With milliseconds: `2026-11-23T23:17:59.250Z`.
    static func formatWithMilliseconds(_ date: Date) -> String {
        let seconds = date.timeIntervalSince1970.rounded(.down)
        let milliseconds = min(Int(((date.timeIntervalSince1970 - seconds) * 1000).rounded(.down)), 999)
        return format(fields: CivilTime.fields(epochSeconds: Int(seconds)), fraction: cFormat(".%03d", Int32(milliseconds)))
    }

    private static func format(fields: CivilTime.Fields, fraction: String?) -> String {
        cFormat("%04d-%02d-%02dT%02d:%02d:%02d", Int32(fields.year), Int32(fields.month), Int32(fields.day),
                Int32(fields.hour), Int32(fields.minute), Int32(fields.second)) + (fraction ?? "") + "Z"
    }

    static func parse(_ text: String) -> Date? {
        var scanner = FixedLayoutScanner(text)
        guard let year = scanner.digits(4), scanner.literal("-"), let month = scanner.digits(2), scanner.literal("-"),
              let day = scanner.digits(2), scanner.literal("T"),
              let hour = scanner.digits(2), scanner.literal(":"), let minute = scanner.digits(2), scanner.literal(":"),
              let second = scanner.digits(2) else { return nil }
        var fraction = 0.0
        if scanner.literal(".") {
            guard let value = scanner.fraction() else { return nil }
            fraction = value
        }
        var offsetSeconds = 0
        if scanner.literal("Z") {
        } else if let sign = scanner.oneOf(["+", "-"]) {
            guard let offsetHours = scanner.digits(2), scanner.literal(":"), let offsetMinutes = scanner.digits(2),
                  offsetHours <= 23, offsetMinutes <= 59 else { return nil }
            offsetSeconds = (offsetHours * 3_600 + offsetMinutes * 60) * (sign == 0 ? 1 : -1)
        } else {
            return nil
        }
        guard scanner.isAtEnd,
              let local = CivilTime.epochSeconds(.init(year: year, month: month, day: day, hour: hour, minute: minute, second: second))
        else { return nil }
        return Date(timeIntervalSince1970: Double(local - offsetSeconds) + fraction)
    }
}

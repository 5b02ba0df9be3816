/// Proleptic Gregorian calendar arithmetic in UTC for the two date formats we read and write
/// (RFC 3339 in the token file, IMF-fixdate in `Retry-After`), so neither needs a calendar library.
enum CivilTime {
    struct Fields: Equatable {
        var year: Int, month: Int, day: Int
        var hour: Int, minute: Int, second: Int
    }

    /// Seconds since 1970-01-01T00:00:00Z, or nil when a field is out of range (Feb 30, hour 24, …).
    static func epochSeconds(_ fields: Fields) -> Int? {
        guard (1...9999).contains(fields.year), (1...12).contains(fields.month),
              (1...daysIn(month: fields.month, year: fields.year)).contains(fields.day),
              (0...23).contains(fields.hour), (0...59).contains(fields.minute), (0...59).contains(fields.second) else { return nil }
        return daysSinceEpoch(year: fields.year, month: fields.month, day: fields.day) * 86_400
            + fields.hour * 3_600 + fields.minute * 60 + fields.second
    }

    /// The UTC fields of whole `seconds` since the epoch (negative allowed).
    static func fields(epochSeconds seconds: Int) -> Fields {
        let days = seconds >= 0 ? seconds / 86_400 : -((-seconds + 86_399) / 86_400)
        let secondOfDay = seconds - days * 86_400
        let (year, month, day) = civil(daysSinceEpoch: days)
        return Fields(year: year, month: month, day: day,
                      hour: secondOfDay / 3_600, minute: secondOfDay % 3_600 / 60, second: secondOfDay % 60)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days from 1970-01-01 to the given date (era-based, exact for all years in 1...9999).
    private static func daysSinceEpoch(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    private static func civil(daysSinceEpoch days: Int) -> (Int, Int, Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}

/// A cursor over ASCII text for the fixed-layout date parsers.
struct FixedLayoutScanner {
    private let bytes: [UInt8]
    private(set) var index = 0

    init(_ text: String) { bytes = Array(text.utf8) }

    var isAtEnd: Bool { index == bytes.count }
    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    /// Exactly `count` decimal digits.
    mutating func digits(_ count: Int) -> Int? {
        guard index + count <= bytes.count else { return nil }
        var value = 0
        for byte in bytes[index..<index + count] {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        index += count
        return value
    }

    /// One or more decimal digits, as the fraction of a second they spell (".5" → 0.5).
    mutating func fraction() -> Double? {
        var value = 0.0
        var scale = 1.0
        let start = index
        while let byte = peek, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
            scale /= 10
            value += Double(byte - UInt8(ascii: "0")) * scale
            index += 1
        }
        return index > start ? value : nil
    }

    mutating func literal(_ text: String) -> Bool {
        let wanted = Array(text.utf8)
        guard index + wanted.count <= bytes.count, Array(bytes[index..<index + wanted.count]) == wanted else { return false }
        index += wanted.count
        return true
    }

    /// Which of `options` comes next (exact case); its position in `options`.
    mutating func oneOf(_ options: [String]) -> Int? {
        for (position, option) in options.enumerated() where literal(option) { return position }
        return nil
    }
}

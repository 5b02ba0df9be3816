import FoundationEssentials

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only HTTP-date form a sender may generate
/// (RFC 9110 §5.6.7). Names are matched exactly; the weekday is not checked against the date.
enum HTTPDate {
    private static let weekdays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func parse(_ text: String) -> Date? {
        var scanner = FixedLayoutScanner(text)
        guard scanner.oneOf(weekdays) != nil, scanner.literal(", "), let day = scanner.digits(2), scanner.literal(" "),
              let month = scanner.oneOf(months), scanner.literal(" "), let year = scanner.digits(4), scanner.literal(" "),
              let hour = scanner.digits(2), scanner.literal(":"), let minute = scanner.digits(2), scanner.literal(":"),
              let second = scanner.digits(2), scanner.literal(" GMT"), scanner.isAtEnd,
              let seconds = CivilTime.epochSeconds(.init(year: year, month: month + 1, day: day, hour: hour, minute: minute, second: second))
        else { return nil }
        return Date(timeIntervalSince1970: Double(seconds))
    }
}

import HTTPWire

/// Refuses requests whose framing or header syntax is ambiguous, before anything is forwarded.
///
/// Request smuggling needs two parsers that disagree about where a message ends or what it says.
/// tokenrelay re-frames every request (an exact Content-Length, fields re-emitted one per line), so the
/// upstream always sees one unambiguous message; but *which* message that is must not depend on a
/// guess. HTTPWire's parser already refuses Content-Length together with Transfer-Encoding, a duplicate
/// or signed Content-Length, codings other than a lone `chunked`, an empty or invalid field name, control
/// characters in a value and a missing or second Host. These rules say the same on the parsed field
/// table, as a second line that does not depend on the parser's settings; they cost a pass over bytes
/// already in cache.
///
/// Accepted on purpose, because the message they produce is unambiguous once parsed and the upstream
/// never sees the original bytes: bare-LF line endings (RFC 9112 §2.2 allows a recipient to accept them)
/// and obs-fold, which the parser replaces with spaces (the RFC 9112 §5.2 option for a proxy).
enum RequestHygiene {
    struct Violation: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    /// Checks the client's field table, as HTTPWire parsed it. `isHTTP11` enables the one-Host rule.
    static func check(_ table: FieldTable, isHTTP11: Bool) -> Violation? {
        var hosts = 0
        for index in 0..<table.count {
            let name = table.name(index)
            // HTTPWire's checks of the same byte classes, a word at a time (`ASCII`'s go byte by byte).
            guard HTTPWire.isToken(name) else {
                return Violation(description: name.isEmpty ? "empty header name" : "invalid header name")
            }
            guard HTTPWire.isFieldValue(table.value(index)) else {
                return Violation(description: "control character in the value of \(String(decoding: name, as: UTF8.self))")
            }
            if ASCII.equalIgnoringCase(name, "host") { hosts += 1 }
        }
        if let problem = MessageFraming.problem(table, equalDuplicateLengths: false) { return Violation(description: problem) }
        // RFC 9112 §3.2: an HTTP/1.1 request without exactly one Host is answered 400.
        if hosts > 1 || (isHTTP11 && hosts == 0) { return Violation(description: "a request needs exactly one Host header") }
        return nil
    }
}

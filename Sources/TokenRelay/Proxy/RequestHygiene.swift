/// Refuses requests whose framing or header syntax is ambiguous, before anything is forwarded.
///
/// Request smuggling needs two parsers that disagree about where a message ends or what it says.
/// tokenrelay re-frames every request (an exact Content-Length, headers re-emitted one per line), so the
/// upstream always sees one unambiguous message; but *which* message that is must not depend on a
/// guess. evhttp (2.1.12 with Debian's patches) already answers 400 for CL together with TE, a
/// non-final `chunked`, and CR/LF inside a value. It still accepts, among others (docs/evhttp.md, limits-it-does-not-have):
/// a duplicate Content-Length (the first wins), `+3` as a length, an empty header name, and
/// `Transfer-Encoding` values it does not understand. Those are refused here.
///
/// Accepted on purpose, because the message they produce is unambiguous once evhttp has parsed it and
/// the upstream never sees the original bytes: bare-LF line endings (RFC 9112 §2.2 allows a recipient
/// to accept them) and obs-fold, which evhttp replaces with a space (the RFC 9112 §5.2 option for a
/// proxy).
enum RequestHygiene {
    struct Violation: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    /// Checks the client's parsed request headers. `isHTTP11` enables the one-Host rule.
    static func check(_ headers: [(name: String, value: String)], isHTTP11: Bool) -> Violation? {
        var hosts = 0
        for header in headers {
            guard HTTPSyntax.isToken(header.name) else {
                return Violation(description: header.name.isEmpty ? "empty header name" : "invalid header name")
            }
            guard HTTPSyntax.isSafeHeaderValue(header.value) else {
                return Violation(description: "control character in the value of \(header.name)")
            }
            if HTTPSyntax.isField(header.name, "host") { hosts += 1 }
        }
        if let problem = MessageFraming.problem(headers, equalDuplicateLengths: false) { return Violation(description: problem) }
        // RFC 9112 §3.2: an HTTP/1.1 request without exactly one Host is answered 400.
        if hosts > 1 || (isHTTP11 && hosts == 0) { return Violation(description: "a request needs exactly one Host header") }
        return nil
    }
}

extension RequestHygiene {
    /// `check(_:isHTTP11:)` on the client's field table, as HTTPWire parsed it.
    static func check(_ table: FieldTable, isHTTP11: Bool) -> Violation? {
        var hosts = 0
        for index in 0..<table.count {
            let name = table.name(index)
            guard ASCII.isToken(name) else {
                return Violation(description: name.isEmpty ? "empty header name" : "invalid header name")
            }
            guard ASCII.isSafeHeaderValue(table.value(index)) else {
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

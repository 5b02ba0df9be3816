/// Where a message's body ends, as `Content-Length` and `Transfer-Encoding` say, judged strictly: two
/// parsers that disagree about it are how requests are smuggled and how a response desynchronises a
/// connection shared by several clients.
enum MessageFraming {
    /// Why the framing headers are ambiguous, or nil.
    /// - Parameter equalDuplicateLengths: whether several identical `Content-Length` fields are tolerated
    ///   (RFC 9110 §8.6 lets a recipient accept them; requests refuse them, a proxy in front of us may have
    ///   merged or split them).
    static func problem(_ headers: [(name: String, value: String)], equalDuplicateLengths: Bool) -> String? {
        var lengths: [Substring] = []
        var encodings: [String] = []
        for header in headers {
            if HTTPSyntax.isField(header.name, "content-length") {
                lengths.append(HTTPSyntax.trimmedOWS(Substring(header.value)))
            } else if HTTPSyntax.isField(header.name, "transfer-encoding") {
                encodings.append(header.value)
            }
        }
        if !lengths.isEmpty && !encodings.isEmpty { return "Content-Length together with Transfer-Encoding" }
        if lengths.count > 1 && (!equalDuplicateLengths || Set(lengths).count > 1) {
            return equalDuplicateLengths ? "conflicting Content-Length values" : "more than one Content-Length"
        }
        if let length = lengths.first, length.isEmpty || !length.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            return "invalid Content-Length"
        }
        // The only coding evhttp decodes is a lone `chunked`; anything else would be relayed as a body
        // read one way here and another way by the peer.
        if !encodings.isEmpty {
            let codings = encodings.flatMap { $0.split(separator: ",", omittingEmptySubsequences: false) }
                .map { HTTPSyntax.fieldKey(String(HTTPSyntax.trimmedOWS($0))) }
            if codings != ["chunked"] { return "unsupported Transfer-Encoding" }
        }
        return nil
    }
}

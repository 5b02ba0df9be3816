/// Where a message's body ends, as `Content-Length` and `Transfer-Encoding` say, judged strictly: two
/// parsers that disagree about it are how requests are smuggled and how a response desynchronises a
/// connection shared by several clients.
enum MessageFraming {
    /// Why the framing fields of a received head (its field table) are ambiguous, or nil.
    /// - Parameter equalDuplicateLengths: whether several identical `Content-Length` fields are tolerated
    ///   (RFC 9110 §8.6 lets a recipient accept them; requests refuse them, a proxy in front of us may have
    ///   merged or split them).
    static func problem(_ table: FieldTable, equalDuplicateLengths: Bool) -> String? {
        var lengthCount = 0
        var firstLength = UnsafeRawBufferPointer(start: nil, count: 0)
        var lengthsDiffer = false
        var encodingCount = 0
        for index in 0..<table.count {
            if table.nameIs(index, "content-length") {
                let length = ASCII.trimmedOWS(table.value(index))
                if lengthCount == 0 {
                    firstLength = length
                } else if !length.elementsEqual(firstLength) {
                    lengthsDiffer = true
                }
                lengthCount += 1
            } else if table.nameIs(index, "transfer-encoding") {
                encodingCount += 1
            }
        }
        if lengthCount > 0 && encodingCount > 0 { return "Content-Length together with Transfer-Encoding" }
        if lengthCount > 1 && (!equalDuplicateLengths || lengthsDiffer) {
            return equalDuplicateLengths ? "conflicting Content-Length values" : "more than one Content-Length"
        }
        if lengthCount > 0 && (firstLength.isEmpty || !firstLength.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 })) {
            return "invalid Content-Length"
        }
        if encodingCount > 0 {
            // Exactly one coding in all the fields together, and it is `chunked`: anything else would be
            // relayed as a body read one way here and another way by the peer.
            var codings = 0
            var onlyChunked = true
            for index in 0..<table.count where table.nameIs(index, "transfer-encoding") {
                ASCII.forEachListElement(table.value(index)) { coding in
                    codings += 1
                    if !ASCII.equalIgnoringCase(coding, "chunked") { onlyChunked = false }
                }
            }
            if codings != 1 || !onlyChunked { return "unsupported Transfer-Encoding" }
        }
        return nil
    }
}

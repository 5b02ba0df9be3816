/// A piece of a message body, for both sides: after the head if it has not gone yet (one write instead of
/// two), as one chunk when the body is chunked.
func writeBodyPiece(_ bytes: UnsafeRawBufferPointer, after headBytes: UnsafeRawBufferPointer, chunked: Bool, to stream: SocketStream) {
    if chunked {
        writeChunk(bytes, after: headBytes, to: stream)
    } else {
        stream.write(parts: headBytes, bytes)
    }
}

/// One chunk of a chunked body (size line, data, CRLF) in one writev, after `prefix` (a head not yet sent).
func writeChunk(_ bytes: UnsafeRawBufferPointer, after prefix: UnsafeRawBufferPointer, to stream: SocketStream) {
    var line: (UInt64, UInt64, UInt64) = (0, 0, 0)   // up to 16 hex digits + CRLF, no allocation
    withUnsafeMutableBytes(of: &line) { buffer in
        var digits = 0
        var n = bytes.count
        repeat { digits += 1; n >>= 4 } while n > 0
        n = bytes.count
        for i in stride(from: digits - 1, through: 0, by: -1) {
            let d = UInt8(n & 15)
            buffer[i] = d < 10 ? 0x30 + d : 0x61 + d - 10
            n >>= 4
        }
        buffer[digits] = 0x0D
        buffer[digits + 1] = 0x0A
        let crlf: (UInt8, UInt8) = (0x0D, 0x0A)
        withUnsafeBytes(of: crlf) { crlfBytes in
            stream.write(parts: prefix, UnsafeRawBufferPointer(rebasing: buffer[0..<(digits + 2)]), bytes, crlfBytes)
        }
    }
}

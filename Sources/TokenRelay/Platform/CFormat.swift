import Glibc

/// printf-style formatting through the C library (`vsnprintf`), for the few fixed-width figures we
/// print: zero-padded timestamps, hex digests, file modes, `%.2f` durations. Foundation's
/// `String(format:)` would pull Foundation (and ICU) into the binary for these alone.
/// Formats come from our own source, never from outside data; arguments are plain numbers.
func cFormat(_ format: String, _ arguments: any CVarArg...) -> String {
    withVaList(arguments) { list in
        var buffer = [CChar](repeating: 0, count: 64)
        // vsnprintf consumes the va_list, so a retry with a larger buffer needs a fresh one.
        let needed = Int(vsnprintf(&buffer, buffer.count, format, list))
        guard needed >= buffer.count else { return String(decoding: buffer.prefix(max(needed, 0)).map { UInt8(bitPattern: $0) }, as: UTF8.self) }
        return withVaList(arguments) { again in
            var larger = [CChar](repeating: 0, count: needed + 1)
            let written = Int(vsnprintf(&larger, larger.count, format, again))
            return String(decoding: larger.prefix(max(min(written, needed), 0)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
    }
}

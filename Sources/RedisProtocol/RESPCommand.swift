import CHiredis
import FoundationEssentials

/// hiredis' command formatter: an argument list as the RESP bytes Redis expects (binary-safe, every
/// argument sent with its length).
public enum RESPCommand {
    /// nil only if hiredis cannot allocate.
    public static func format(_ arguments: [Data]) -> [UInt8]? {
        let lengths = arguments.map(\.count)
        // hiredis copies the argument bytes; the pointers only need to live through the call.
        let copies = arguments.map { data -> UnsafeMutablePointer<CChar> in
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, data.count))
            data.withUnsafeBytes { raw in
                if let base = raw.baseAddress { UnsafeMutableRawPointer(buffer).copyMemory(from: base, byteCount: data.count) }
            }
            return buffer
        }
        defer { copies.forEach { $0.deallocate() } }
        var target: UnsafeMutablePointer<CChar>?
        let length = copies.map { UnsafePointer<CChar>?($0) }.withUnsafeBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                redisFormatCommandArgv(&target, Int32(arguments.count), UnsafeMutablePointer(mutating: argv.baseAddress), argvlen.baseAddress)
            }
        }
        guard length > 0, let target else { return nil }
        defer { redisFreeCommand(target) }
        return [UInt8](UnsafeRawBufferPointer(start: target, count: Int(length)))
    }

    public static func format(_ arguments: [String]) -> [UInt8]? {
        format(arguments.map { Data($0.utf8) })
    }
}

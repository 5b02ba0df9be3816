import CLibevent

/// Small helpers over libevent's `evbuffer`, which stays the owner of the bytes.
enum EvBuffer {
    static func length(_ buffer: OpaquePointer?) -> Int {
        guard let buffer else { return 0 }
        return evbuffer_get_length(buffer)
    }

    static func append(_ buffer: OpaquePointer, _ string: String) {
        var string = string
        string.withUTF8 { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
    }

    static func append(_ buffer: OpaquePointer, _ bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
    }

    /// Copies the whole buffer out (for small, bounded payloads only: token responses, captured 401 bodies).
    static func bytes(_ buffer: OpaquePointer?) -> [UInt8] {
        guard let buffer else { return [] }
        let count = evbuffer_get_length(buffer)
        guard count > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { storage, initialized in
            initialized = Int(evbuffer_copyout(buffer, storage.baseAddress, count))
        }
    }
}

import CLibevent

/// Read and write access to an evhttp header list (`struct evkeyvalq`), keeping order and duplicates.
struct HeaderList {
    let raw: UnsafeMutablePointer<evkeyvalq>

    /// All headers in received order (names in received case).
    var entries: [(name: String, value: String)] {
        var result: [(String, String)] = []
        var node = raw.pointee.tqh_first
        while let current = node {
            result.append((String(cString: current.pointee.key), String(cString: current.pointee.value)))
            node = current.pointee.next.tqe_next
        }
        return result
    }

    /// First value of `name` (ASCII case-insensitive, as evhttp compares).
    func value(_ name: String) -> String? {
        evhttp_find_header(raw, name).map { String(cString: $0) }
    }

    /// Every value of `name`, in order.
    func values(_ name: String) -> [String] {
        var result: [String] = []
        var node = raw.pointee.tqh_first
        while let current = node {
            if evutil_ascii_strcasecmp(current.pointee.key, name) == 0 { result.append(String(cString: current.pointee.value)) }
            node = current.pointee.next.tqe_next
        }
        return result
    }

    /// Appends a header; returns false when evhttp refuses it (CR or LF in the value).
    @discardableResult
    func add(_ name: String, _ value: String) -> Bool {
        evhttp_add_header(raw, name, value) == 0
    }

    /// Removes every header called `name`.
    func removeAll(_ name: String) {
        while evhttp_remove_header(raw, name) == 0 {}
    }
}

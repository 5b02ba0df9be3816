import CLibevent
import Glibc

/// One asynchronous name lookup on a loop's resolver (`evdns_getaddrinfo`): the loop never blocks on DNS.
///
/// libevent calls a lookup's callback exactly once: with the addresses, with an error, or, after
/// `evdns_getaddrinfo_cancel`, with a cancellation that it delivers later from the loop. So the callback's
/// context is this object retained for it (released by that one call), not the connection that asked: a
/// connection closed while resolving is gone before the cancellation arrives, and the callback must not
/// reach it. `cancel()` forgets the completion, so nothing runs after it.
final class NameLookup {
    /// Letters, digits, '-', '_' and '.', at most 253 bytes: what a resolver may be asked.
    static func isHostName(_ host: String) -> Bool {
        guard !host.isEmpty, host.utf8.count <= 253 else { return false }
        return host.utf8.allSatisfy { b in
            (b >= 0x61 && b <= 0x7A) || (b >= 0x41 && b <= 0x5A) || (b >= 0x30 && b <= 0x39) || b == 0x2D || b == 0x2E || b == 0x5F
        }
    }

    enum Outcome {
        case addresses([SocketAddress])
        case failed(String)
    }

    private var completion: ((Outcome) -> Void)?
    private var request: OpaquePointer?
    /// The callback has run (possibly inside `evdns_getaddrinfo`, before `start` returned).
    private var answered = false

    private init(completion: @escaping (Outcome) -> Void) {
        self.completion = completion
    }

    /// Starts resolving `host` (A and AAAA records, or the hosts file). `completion` runs on the loop's
    /// thread, possibly before this returns (hosts-file entries and immediate failures are answered at once).
    static func start(loop: TransportLoop, host: String, port: UInt16, completion: @escaping (Outcome) -> Void) -> NameLookup {
        let lookup = NameLookup(completion: completion)
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_protocol = Int32(IPPROTO_TCP)
        // Only address families this host can reach: no AAAA question without an IPv6 address.
        hints.ai_flags = AI_ADDRCONFIG
        let context = Unmanaged.passRetained(lookup).toOpaque()
        let request = evdns_getaddrinfo(loop.dnsBase, host, String(port), &hints, nameLookupTrampoline, context)
        if !lookup.answered { lookup.request = request }
        return lookup
    }

    /// Gives up the lookup: the completion will not run.
    func cancel() {
        completion = nil
        guard !answered, let request else { return }
        self.request = nil
        evdns_getaddrinfo_cancel(request)
    }

    fileprivate func finish(_ result: Int32, _ list: UnsafeMutablePointer<addrinfo>?) {
        answered = true
        request = nil
        let addresses = SocketAddress.all(in: list)
        if let list { evutil_freeaddrinfo(list) }
        guard let completion else { return }
        self.completion = nil
        if result != 0 {
            completion(.failed(String(cString: evutil_gai_strerror(result))))
        } else if addresses.isEmpty {
            completion(.failed("no IPv4 or IPv6 address"))
        } else {
            completion(.addresses(addresses))
        }
    }
}

private let nameLookupTrampoline: @convention(c) (Int32, UnsafeMutablePointer<addrinfo>?, UnsafeMutableRawPointer?) -> Void = { result, list, context in
    guard let context else {
        if let list { evutil_freeaddrinfo(list) }
        return
    }
    // Balances the retain taken for this one callback.
    let lookup = Unmanaged<NameLookup>.fromOpaque(context).takeRetainedValue()
    lookup.finish(result, list)
}

import CLibevent

// The one place where C callbacks cross into Swift.
//
// libevent hands every callback a `void *` context. Each Swift object that registers a callback passes
// itself *unretained*; the object keeps itself alive for as long as any registration can fire and removes
// every registration before it lets go (see `HTTPListener`). Per-registration
// retains would not balance, because libevent does not call back exactly once (a persistent event fires
// many times, a freed one never again).
//
// Every trampoline is a non-capturing global closure in this (non-main) file, so Swift 6 never infers
// `@MainActor` isolation for it: such an inferred closure traps at run time when libevent calls it.
// Callbacks run inside `withExtendedLifetime` because handling one may drop the object's last reference.

@inline(__always)
private func target<T: AnyObject>(_ context: UnsafeMutableRawPointer?, as _: T.Type) -> T {
    Unmanaged<T>.fromOpaque(context!).takeUnretainedValue()
}

@inline(__always)
func unretainedContext<T: AnyObject>(_ object: T) -> UnsafeMutableRawPointer {
    Unmanaged.passUnretained(object).toOpaque()
}

/// `evhttp_set_gencb` callback for `HTTPListener`: a complete request (headers and body) has arrived.
let listenerRequestTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, context in
    guard let request else { return }
    let listener = target(context, as: HTTPListener.self)
    withExtendedLifetime(listener) { listener.handler(request) }
}

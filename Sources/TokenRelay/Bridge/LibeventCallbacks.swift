import CLibevent

// The one place where C callbacks cross into Swift.
//
// libevent hands every callback a `void *` context. Each Swift object that registers a callback passes
// itself *unretained*; the object keeps itself alive for as long as any registration can fire and removes
// every registration before it lets go (see `OutgoingRequest`, `Exchange`, `LoopEvent`). Per-registration
// retains would not balance, because libevent does not call back exactly once: a cancelled request gets
// no done callback, a freed connection drops its requests silently, and the done callback receives NULL
// on failure.
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

/// `event_new` callback for `LoopEvent` (timers, signals, fd watchers, cross-component wake-ups).
let loopEventTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, what, context in
    let event = target(context, as: LoopEvent.self)
    withExtendedLifetime(event) { event.fire(what) }
}

/// `evhttp_set_gencb` callback for `HTTPListener`: a complete request (headers and body) has arrived.
let listenerRequestTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, context in
    guard let request else { return }
    let listener = target(context, as: HTTPListener.self)
    withExtendedLifetime(listener) { listener.handler(request) }
}

/// Response headers of an outgoing request. Returning 0 lets evhttp continue.
let outgoingHeaderTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Int32 = { request, context in
    guard let request else { return 0 }
    let call = target(context, as: OutgoingRequest.self)
    // -1 makes evhttp fail the request (error callback, then the done callback without a response).
    return withExtendedLifetime(call) { call.receivedHeaders(request) } ? 0 : -1
}

/// A piece of an outgoing request's response body.
let outgoingChunkTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, context in
    guard let request else { return }
    let call = target(context, as: OutgoingRequest.self)
    withExtendedLifetime(call) { call.receivedBody(request) }
}

/// Failure of an outgoing request; evhttp calls the done callback (with NULL) afterwards, except on cancel.
let outgoingErrorTrampoline: @convention(c) (evhttp_request_error, UnsafeMutableRawPointer?) -> Void = { error, context in
    let call = target(context, as: OutgoingRequest.self)
    withExtendedLifetime(call) { call.failed(error) }
}

/// Completion of an outgoing request; `request` is NULL when it failed.
let outgoingDoneTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, context in
    let call = target(context, as: OutgoingRequest.self)
    withExtendedLifetime(call) { call.completed(request) }
}

/// OpenSSL's passphrase callback for encrypted private keys: there is nobody to ask, so loading fails
/// (and `check` says so) instead of OpenSSL prompting on a terminal a sidecar does not have.
let refuseKeyPassphraseTrampoline: @convention(c) (UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?) -> Int32 = { _, _, _, _ in
    0
}

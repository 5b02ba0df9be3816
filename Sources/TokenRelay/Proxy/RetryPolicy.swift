import CLibevent

/// Which methods may be sent again after the connection died under them: those whose processing twice
/// is harmless by definition (RFC 9110 §9.2.2). The rule that uses it is `RequestLifecycle`'s.
enum RetryPolicy {
    static func isIdempotent(_ method: evhttp_cmd_type) -> Bool {
        [EVHTTP_REQ_GET, EVHTTP_REQ_HEAD, EVHTTP_REQ_OPTIONS, EVHTTP_REQ_PUT, EVHTTP_REQ_DELETE, EVHTTP_REQ_TRACE].contains(method)
    }
}

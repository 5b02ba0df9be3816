import CLibevent

/// The last fatal alert the peer sent on a TLS connection, kept on its `SSL` as it is read.
///
/// Where a TLS 1.3 server refuses our client certificate, its alert can arrive while evhttp still
/// considers the connection to be connecting; evhttp then reports a plain connect failure and resets
/// the connection, and the OpenSSL errors libevent queued are gone with it. OpenSSL's info callback sees
/// the alert whichever way evhttp goes, so the cause ("certificate required") is never lost.
enum TLSAlerts {
    /// Our slot in each `SSL`'s ex_data: the alert as an integer (no allocation, nothing to free).
    private static let slot: Int32 = CRYPTO_get_ex_new_index(CRYPTO_EX_INDEX_SSL, 0, nil, nil, nil, nil)
    /// Marks a stored value as present (an alert code can be 0).
    private static let present = 0x10000

    static func watch(_ ssl: OpaquePointer) {
        SSL_set_info_callback(ssl, tlsInfoTrampoline)
    }

    fileprivate static func record(_ ssl: OpaquePointer, alert: Int32) {
        SSL_set_ex_data(ssl, slot, UnsafeMutableRawPointer(bitPattern: Int(alert) & 0xFFFF | present))
    }

    /// "TLS alert from the peer: certificate required", once: reading it clears it.
    static func takeFatalAlert(_ ssl: OpaquePointer) -> String? {
        guard let stored = SSL_get_ex_data(ssl, slot) else { return nil }
        SSL_set_ex_data(ssl, slot, nil)
        let alert = Int32(Int(bitPattern: stored) & 0xFFFF)
        return "TLS alert from the peer: " + String(cString: SSL_alert_desc_string_long(alert))
    }
}

/// OpenSSL's info callback (`SSL_set_info_callback`): records fatal alerts the peer sends.
private let tlsInfoTrampoline: @convention(c) (OpaquePointer?, Int32, Int32) -> Void = { ssl, event, value in
    // For alerts `value` is level << 8 | description; level 2 is fatal.
    guard let ssl, event & Int32(SSL_CB_READ_ALERT) == Int32(SSL_CB_READ_ALERT), value >> 8 == 2 else { return }
    TLSAlerts.record(ssl, alert: value & 0xFF)
}

import HTTPTransport
import HTTPWire
import Logging

/// A WebSocket (or other protocol upgrade) after the upstream's `101 Switching Protocols`: the client's
/// connection and the upstream's are relayed byte for byte by a `ByteTunnel` until both directions end.
///
/// The handshake itself was an ordinary request (`RelayedExchange`: token injected, a 401 held, refreshed
/// and replayed). From the 101 on, the tunnel is what the proxy counts as in flight: a graceful shutdown
/// waits for it until the drain deadline and then cuts it (`abandon`). The client connection stays
/// counted against `limits.max_client_connections` until the tunnel closes it; the upstream connection
/// leaves its pool at the 101 (open WebSockets must never take the connections ordinary requests need)
/// and counts against `limits.max_tunnels` instead, from the handshake's arrival until the tunnel closes. `timeouts.stream_idle_seconds` bounds a tunnel with
/// no byte in either direction, as it bounds a silent response stream.
final class UpgradeTunnel: ProxiedExchange {
    /// Weak: at exit the proxy's front end closes its connections while the proxy is being freed, and the
    /// tunnel's end report must not reach into it then.
    private weak var proxy: ProxyServer?
    private var tunnel: ByteTunnel?
    private let openedAt = EventLoop.monotonicNow
    private let protocolName: String
    var activeSlot = -1

    private init(proxy: ProxyServer, protocolName: String) {
        self.proxy = proxy
        self.protocolName = protocolName
    }

    /// Whether a client request asks to switch protocols in a way tokenrelay relays (RFC 9110 §7.8): a
    /// bodiless HTTP/1.1 GET with `Upgrade` listed in `Connection`. The protocol asked for, or nil.
    ///
    /// `h2c` is never relayed: HTTP/2 after a 101 would be a raw tunnel that no token, base path or
    /// refresh rule reaches. It is left out of the list, and a request that asked for it alone is
    /// answered as the HTTP/1.1 request it also is (a server may ignore `Upgrade`, RFC 9110 §7.8;
    /// `Upgrade`, `HTTP2-Settings` and `Connection` are hop-by-hop and dropped). HTTP/2 clients use prior
    /// knowledge instead.
    static func requestedProtocol(_ head: ReceivedRequestHead, on client: HTTPServerConnection) -> String? {
        guard head.method == .get, client.requestAsksForUpgrade, let value = head.field("upgrade") else { return nil }
        return relayedProtocols(value)
    }

    /// The protocols of an `Upgrade` value that may be relayed (all but `h2c`), or nil when none is left.
    static func relayedProtocols(_ value: String) -> String? {
        let kept = value.split(separator: ",").map { $0.trimmingWhitespace() }
            .filter { !$0.isEmpty && $0.lowercased() != "h2c" && !$0.lowercased().hasPrefix("h2c/") }
        return kept.isEmpty ? nil : kept.joined(separator: ", ")
    }

    /// Answers the client with the upstream's 101 (its end-to-end fields, its `Upgrade`) and joins the two
    /// connections. False when a side is gone already (the caller then treats the upstream as failed).
    static func open(proxy: ProxyServer, client: HTTPServerConnection, upstream: HTTPClientConnection,
                     response: ReceivedResponseHead, requestedProtocol: String) -> Bool {
        guard let upstreamEnd = upstream.detachForTunnel() else { return false }
        let switchedTo = response.field("upgrade") ?? requestedProtocol
        let clientEnd = response.withFieldTable { table in
            client.switchProtocols(reason: UnsafeRawBufferPointer(rebasing: table.bytes[response.parsed.reason])) { block in
                HeaderPolicy.writeForwardedResponseFields(table, into: &block)
                block.append(name: "Upgrade", value: switchedTo)
            }
        }
        guard let clientEnd else {
            upstreamEnd.close()
            return false
        }
        let opened = UpgradeTunnel(proxy: proxy, protocolName: switchedTo)
        proxy.began(opened)
        let settings = ByteTunnel.Settings(bufferLimit: 256 * 1024, idleTimeout: proxy.config.timeouts.streamIdleSeconds)
        opened.tunnel = ByteTunnel(loop: proxy.loop.transport, clientEnd, upstreamEnd, settings: settings) { [weak opened] end in
            opened?.ended(end)
        }
        return true
    }

    private func ended(_ end: ByteTunnel.End) {
        guard let proxy else { return }
        let fromClient = tunnel?.bytesFromFirst ?? 0
        let fromUpstream = tunnel?.bytesFromSecond ?? 0
        tunnel = nil
        let reason: String = switch end {
        case .closed: "closed"
        case .idleTimeout: "idle timeout"
        case .failed(let code): "connection failed (errno \(code))"
        case .cut: "cut at shutdown"
        }
        proxy.logger.info("upgraded connection ended", metadata: [
            "protocol": "\(protocolName)", "reason": "\(reason)", "bytes_from_client": "\(fromClient)",
            "bytes_from_upstream": "\(fromUpstream)", "seconds": "\(Int(EventLoop.monotonicNow - openedAt))",
        ])
        proxy.tunnelEnded(self)
    }

    func refreshFinished(_ outcome: RefreshCoordinator.Outcome) {}

    /// The drain deadline passed: the tunnel is cut (a WebSocket may stay open for hours).
    func abandon() {
        tunnel?.close()
    }
}

import CLibevent
import HTTPWire
import Glibc

/// Connecting: the name's addresses tried in turn, the connect timeout, and how a failure on the way
/// becomes `.connectFailed` (or the initializer's throw). Apart from `HTTPClientConnection.swift` because
/// it runs once per connection, before any request.
extension HTTPClientConnection {
    func resolved(_ outcome: NameLookup.Outcome) {
        lookup = nil
        resolvedAtOnce = initializing
        guard !hasEnded else { return }
        switch outcome {
        case .failed(let reason):
            connectFailed("cannot resolve \(host): \(reason)", cause: .nameResolution)
        case .addresses(let addresses):
            candidates = addresses
            tryNextAddress()
        }
    }

    /// Connects to the next address; when none is left, the connection fails with the last cause.
    func tryNextAddress() {
        while !candidates.isEmpty {
            let address = candidates.removeFirst()
            var storage = address.storage
            remote = PeerAddress(&storage)
            let target = remote?.description ?? "\(host):\(port)"
            if let error = stream.connect(to: address) {
                lastConnectFailure = "connect \(target): \(String(cString: strerror(error)))"
                continue
            }
            return
        }
        connectFailed(lastConnectFailure ?? "connect \(host):\(port): no address to try", cause: .connect)
    }

    func connectFailed(_ description: String, cause: ConnectFailureCause) {
        guard !hasEnded else { return }
        connectFailureCause = cause
        if initializing {
            failureDuringInit = description
            return
        }
        end(.connectFailed(description))
        closeNow()
    }

    func connectTimeExpired() {
        guard !connected, !hasEnded else { return }
        let whole = connectTimeout.rounded() == connectTimeout && connectTimeout < 1e9
        let limit = whole ? "\(Int(connectTimeout)) s" : "\(connectTimeout) s"
        if lookup != nil {
            connectFailed("cannot resolve \(host): no answer within \(limit)", cause: .timedOut)
        } else if stream.isHandshaking {
            connectFailed("TLS handshake with \(remote?.description ?? host) did not finish within \(limit)", cause: .timedOut)
        } else {
            connectFailed("connect \(remote?.description ?? host) did not finish within \(limit)", cause: .timedOut)
        }
    }

    /// Closes the socket, and forgets a lookup still running (its answer must not reach a closed connection).
    func closeNow() {
        lookup?.cancel()
        lookup = nil
        stream.close()
    }
}

/// The one error every listener of tokenrelay (the proxied port, the admin listener, the demo's servers)
/// throws when its address cannot be bound, with one message shape: "cannot listen on HOST:PORT: reason".
/// `tokenrelay demo` catches it to fall back to a free port.
enum HTTPListener {
    struct BindError: Error, CustomStringConvertible {
        let description: String
    }
}

/// Listeners whose connections count against one connection limit (`HTTPServer.Settings.maxConnections`),
/// as if they were one listener: a process with several proxied listeners (a main one and one per route)
/// keeps `maxConnections` for all of them together instead of that many on each. Loop thread only.
///
/// The group holds what `HTTPServer+ConnectionLimit` counts (connections within the limit, waiting over it,
/// the arrival order), so every rule of the limit applies across the members: a newcomer on one listener
/// may have an idle connection of another closed for it, a slot freed on one goes to the connection waiting
/// longest on any, and while anyone waits, responses on every listener close their connection. The hard
/// bound (the limit plus the allowance) counts every member's connections and pauses accepting on all.
/// Members are given the same limits (`settings`); each applies its own when it acts.
/// A server made without a group has one of its own.
public final class ConnectionLimitGroup {
    var withinLimit = 0
    var overLimit = 0
    var waitingConnections = 0
    /// Set while closing a connection for a particular newcomer, so its slot goes to that one.
    var makingRoom = false
    /// Arrival order across the members (the longest waiting is served first, whichever listener it is on).
    var nextSequence: UInt64 = 0

    /// A member, unowned: a server leaves in its deinit (found by `id`, since its reference may not be
    /// loaded while it is being freed).
    struct Member {
        let id: ObjectIdentifier
        unowned let server: HTTPServer
    }
    private(set) var members: [Member] = []

    public init() {}

    func join(_ server: HTTPServer) {
        members.append(Member(id: ObjectIdentifier(server), server: server))
    }

    func leave(_ id: ObjectIdentifier) {
        members.removeAll { $0.id == id }
    }

    /// Connections open on every member, waiting ones included.
    var openConnections: Int {
        members.count == 1 ? members[0].server.connections.count : members.reduce(0) { $0 + $1.server.connections.count }
    }

    /// Every member's connections (read only at the limit).
    var connections: LazySequence<FlattenSequence<LazyMapSequence<[Member], Dictionary<ObjectIdentifier, HTTPServerConnection>.Values>>> {
        members.lazy.flatMap { $0.server.connections.values }
    }
}

import HTTPTransport

/// Where client requests go under one configuration: the upstream, its connection pool, the mapping of
/// request targets onto it and the paths passed through untouched.
///
/// An exchange takes the route current when it arrives and keeps it to the end, replays after a
/// refresh included. A reload that changes the upstream therefore never splits one request across two
/// upstreams (first send to the old one, replay to the new one with a target mapped for the old one),
/// and a connection always goes back to the pool it came from.
final class UpstreamRoute {
    let upstream: HTTPEndpoint
    /// The `Host` field every forwarded request carries, made and checked once (nil only if the
    /// configured authority could not be sent, which the configuration's own checks rule out).
    let hostField: PreparedField?
    /// The upstream's keep-alive connections; opens none until asked.
    let pool: HTTPTransport.UpstreamPool
    /// The upstream's HTTP/2 connections when `upstream.http2` says to speak HTTP/2 to it; nil: HTTP/1.1.
    let http2Pool: HTTP2UpstreamPool?
    /// Requests go over HTTP/2: `upstream.http2` is on, and (with "alpn") the server has not selected HTTP/1.1.
    var speaksHTTP2: Bool { http2Pool.map { !$0.serverChoseHTTP1 } ?? false }
    /// `speaksHTTP2` for a gRPC call, which only HTTP/2 carries: with "alpn", a server that chose HTTP/1.1
    /// more than a second ago is asked again by the next connection (`HTTP2UpstreamPool.askAgain`).
    func acceptsGRPCCall() -> Bool { http2Pool?.askAgain(notSooner: 1) ?? false }
    let targets: RequestTarget
    private let passthroughPrefixes: [String]
    /// The upstream URL has no path of its own: an origin-form target is sent as it came.
    let forwardsPathsUnchanged: Bool
    var hasPassthroughPaths: Bool { !passthroughPrefixes.isEmpty }

    /// `settings`: the top-level `upstream` or a route's. `budget`: the upstream connections of the whole
    /// process, which every route's pools draw from, both pools of a route on one account (its reserve);
    /// `reservesConnections` false: a route no request reaches (the default of a config without one). `listenHost`/`listenPort`: the listener the route's
    /// requests arrive on (a route's own `listen`, or the main one), which an absolute-form target may name.
    init(_ settings: Config.Upstream, config: Config, upstreamTLS: TLSContext?, loop: EventLoop, listenHost: String? = nil, listenPort: Int,
         budget: UpstreamConnectionBudget, reservesConnections: Bool = true) {
        self.budget = budget
        upstream = settings.url
        hostField = PreparedField(name: "Host", value: settings.url.authority)
        passthroughPrefixes = settings.passthroughPrefixes
        forwardsPathsUnchanged = settings.url.path.allSatisfy { $0 == "/" }
        pool = TransportUpstream.makePool(config: config, upstream: settings.url, tls: upstreamTLS?.transport, loop: loop,
                                          offerHTTP2: settings.http2 == .alpn, budget: budget, account: budgetAccount)
        http2Pool = settings.http2 == .never ? nil
            : TransportUpstream.makeHTTP2Pool(config: config, upstream: settings.url, tls: upstreamTLS?.transport, loop: loop,
                                              http1Allowed: settings.http2 == .alpn, budget: budget, account: budgetAccount)
        targets = RequestTarget(upstream: settings.url, listenHost: listenHost ?? config.listen.host, listenPort: listenPort)
        if !reservesConnections { budget.retire(budgetAccount) }
    }

    private let budget: UpstreamConnectionBudget
    /// The route's share of the budget: its reserve, and the slots its pools use.
    private let budgetAccount = UpstreamBudgetAccount()

    /// Requests that use this route. A reload retires the route's pool only once the last of them has
    /// ended: a held request replays on the route it arrived under.
    private(set) var requestsInFlight = 0
    private var isRetiring = false

    func requestBegan() { requestsInFlight += 1 }

    func requestEnded() {
        requestsInFlight -= 1
        if isRetiring && requestsInFlight == 0 {
            pool.retire()
            http2Pool?.retire()
        }
    }

    /// A reload replaced this route: its pool takes no new requests once its own have ended.
    func retire() {
        isRetiring = true
        // Its reserve goes to the routes that replace it at once; its connections still count until they close.
        budget.retire(budgetAccount)
        if requestsInFlight == 0 {
            pool.retire()
            http2Pool?.retire()
        }
    }

    /// Paths forwarded untouched (no token, no refresh): an API's own login endpoints. A prefix matches on
    /// a segment boundary: `/public` covers `/public` and `/public/x`, never `/publicity`.
    func isPassthrough(_ target: String) -> Bool {
        guard !passthroughPrefixes.isEmpty else { return false }
        var base = upstream.path
        while base.hasSuffix("/") { base.removeLast() }
        let path = target.dropFirst(base.count)
        return passthroughPrefixes.contains { prefix in
            guard path.hasPrefix(prefix) else { return false }
            if prefix.hasSuffix("/") { return true }
            let rest = path.dropFirst(prefix.count)
            return rest.isEmpty || rest.first == "/" || rest.first == "?"
        }
    }
}

/// What the proxy asks of a request in flight (`RelayedExchange`) or of an upgraded connection
/// (`UpgradeTunnel`): the held list releases it after a refresh, and shutdown abandons it when the drain
/// deadline passes.
protocol ProxiedExchange: AnyObject {
    func refreshFinished(_ outcome: RefreshCoordinator.Outcome)
    func abandon()
    /// Where the proxy keeps it in its list of exchanges in flight (its own, set by `began`): removing it
    /// is a swap with the last, without hashing per request.
    var activeSlot: Int { get set }
}

import Logging
import Synchronization

/// The one log level every logger of the process follows, so a reload can change it: swift-log copies
/// a handler into each `Logger`, and a level stored in the handler would stay whatever each copy was
/// given at start. A lock, because helper threads (`OffLoopWork`) may log too.
public final class LogLevelControl: Sendable {
    private let level: Mutex<Logger.Level>

    public init(_ level: Logger.Level) {
        self.level = Mutex(level)
    }

    public var current: Logger.Level {
        get { level.withLock { $0 } }
        set { level.withLock { $0 = newValue } }
    }
}

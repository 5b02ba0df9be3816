import FoundationEssentials

/// The machine's states, each carrying its own data: the phase (idle, a cycle and the step it is at,
/// login required, storm-paused) and the conditions that outlive a cycle (hold-off, unsaved tokens).
extension RefreshMachine {
    /// The cycle under way: the phase's data lives in the phase.
    struct Cycle {
        var mode: Mode
        var trigger: Trigger
        /// The settings it started with: a reload meanwhile applies from the next cycle.
        var settings: Settings
        /// Attempts that reached the lock (a lock timeout counts too).
        var attempt = 0
        var step: Step

        enum Step {
            /// Until the attempt timer fires (first attempt, backoff, `Retry-After`).
            case waiting
            case acquiringLock
            /// The in-flight record is being written; the refresh token leaves once it is on disk.
            case recordingInFlight(RefreshInFlightRecord)
            /// `record` is nil when the grant presents no refresh token (nothing was recorded).
            case exchanging(sentAt: Double, record: RefreshInFlightRecord?)
            /// The answer's tokens are being written; `queued` while an earlier retry's write finishes.
            case persisting(TokenSet, lifetime: Double?, purpose: PersistPurpose, queued: Bool)
        }
    }

    enum PersistPurpose {
        /// Fresh tokens: adopted and released once written.
        case renewal
        /// An unusable answer with a rotated refresh token: kept, the cycle still fails with `reason`.
        case keepRotatedRefreshToken(reason: String)
    }

    enum Phase {
        case idle
        case refreshing(Cycle)
        case loginRequired
        case stormPaused(reason: String)
    }

    /// After an unknown outcome: no refresh token leaves before `until` (monotonic).
    struct HoldOff {
        var until: Double
        var reason: String
    }

    struct Unsaved {
        var error: String
        var failedWrites: Int
    }
}

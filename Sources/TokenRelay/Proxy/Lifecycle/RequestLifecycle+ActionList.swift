extension RequestLifecycle {
    /// The actions one event yields, in order: the first three inline, any more in `more`. A machine step
    /// runs several times for every request, and an array per step would be an allocation each time;
    /// the steps of an ordinary request yield one to three actions, only failures and deadlines more.
    ///
    /// Built with the fixed-arity initialisers in the machine (an array literal would allocate the array
    /// it is made from; the tests use literals freely). Read by index: an iterator is a copy of the list.
    struct ActionList: RandomAccessCollection, ExpressibleByArrayLiteral, Equatable, CustomStringConvertible {
        /// Unused slots hold any action (actions are plain bytes, see `Action`). Stored properties, not a tuple: a tuple of enums is copied through the runtime's generic tuple
        /// witness, several times slower.
        private var slot0 = Action.cancelConnectionWait, slot1 = Action.cancelConnectionWait, slot2 = Action.cancelConnectionWait
        /// Optional, so that a list without it destroys nothing here.
        private var more: [Action]?
        private(set) var count = 0
        /// What this list's rare actions name but do not carry (`.respond`, `.upstreamFailed`, `.retrying`):
        /// beside the actions rather than in them, so that actions stay plain bytes, and in the list rather
        /// than in the machine, so that the machine (copied on every step) stays plain bytes too. One box,
        /// nil on the ordinary path, so that dropping a list costs one null check for it.
        private var payloads: Payloads?

        /// tokenrelay's own answer, for this list's `.respond`.
        var answer: LocalResponse? { payloads?.answer }
        /// The upstream failure this list's `.upstreamFailed` or `.retrying` reports.
        var failure: UpstreamFailure? { payloads?.failure }

        /// Immutable, replaced whole: a copied list never sees another list's change.
        private final class Payloads {
            let answer: LocalResponse?
            let failure: UpstreamFailure?

            init(answer: LocalResponse?, failure: UpstreamFailure?) {
                self.answer = answer
                self.failure = failure
            }
        }

        /// The list with `response` as the answer of its `.respond`.
        func answering(_ response: LocalResponse) -> ActionList {
            var list = self
            list.payloads = Payloads(answer: response, failure: failure)
            return list
        }

        /// The list with `failure` as the one its `.upstreamFailed` or `.retrying` reports.
        func reporting(_ failure: UpstreamFailure) -> ActionList {
            var list = self
            list.payloads = Payloads(answer: answer, failure: failure)
            return list
        }

        init() {}
        // Slots filled directly, not through `append`: a machine step builds one of these every time.
        init(_ a: Action) { slot0 = a; count = 1 }
        init(_ a: Action, _ b: Action) { slot0 = a; slot1 = b; count = 2 }
        init(_ a: Action, _ b: Action, _ c: Action) { slot0 = a; slot1 = b; slot2 = c; count = 3 }
        init(_ a: Action, _ b: Action, _ c: Action, _ d: Action) { self.init(a, b, c); append(d) }

        init(arrayLiteral elements: Action...) {
            for element in elements { append(element) }
        }

        var startIndex: Int { 0 }
        var endIndex: Int { count }

        subscript(position: Int) -> Action {
            precondition(position >= 0 && position < count, "action index out of range")
            switch position {
            case 0: return slot0
            case 1: return slot1
            case 2: return slot2
            default: return more![position - 3]
            }
        }

        /// Moves the action at `position` out, for a driver that is done with the list (actions are plain
        /// bytes, so this is a read; kept as a move so that the driver's loop does not depend on that).
        mutating func take(at position: Int) -> Action {
            precondition(position >= 0 && position < count, "action index out of range")
            var taken = Action.cancelConnectionWait
            switch position {
            case 0: swap(&taken, &slot0)
            case 1: swap(&taken, &slot1)
            case 2: swap(&taken, &slot2)
            default: swap(&taken, &more![position - 3])
            }
            return taken
        }

        mutating func append(_ action: Action) {
            switch count {
            case 0: slot0 = action
            case 1: slot1 = action
            case 2: slot2 = action
            default: more = (more ?? []) + [action]
            }
            count += 1
        }

        /// Joins another step's actions (the queue's waiting ones, or the parts of one step). At most one
        /// answer is ever given (it comes with `finish`), and a failure is reported before the next one can
        /// happen (the retry's `.retrying` runs before its `.acquireFreshConnection`, the only way to a
        /// second failure), so a later list's payload never replaces one that an earlier action still needs.
        mutating func append(contentsOf other: ActionList) {
            for index in 0..<other.count { append(other[index]) }
            if let added = other.payloads {
                payloads = Payloads(answer: added.answer ?? answer, failure: added.failure ?? failure)
            }
        }

        /// Takes the actions out, leaving the list empty (no copy of the list).
        mutating func take() -> ActionList {
            var taken = ActionList()
            swap(&taken, &self)
            return taken
        }

        static func + (lhs: ActionList, rhs: ActionList) -> ActionList {
            var joined = lhs
            joined.append(contentsOf: rhs)
            return joined
        }

        static func += (lhs: inout ActionList, rhs: ActionList) {
            lhs.append(contentsOf: rhs)
        }

        static func == (lhs: ActionList, rhs: ActionList) -> Bool {
            lhs.elementsEqual(rhs) && lhs.answer == rhs.answer && lhs.failure == rhs.failure
        }

        var description: String { "\(Array(self))" }
    }
}

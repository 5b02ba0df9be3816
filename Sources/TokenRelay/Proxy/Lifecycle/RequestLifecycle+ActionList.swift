extension RequestLifecycle {
    /// The actions one event yields, in order: the first three inline, any more in `more`. A machine step
    /// runs several times for every request, and an array per step would be an allocation each time;
    /// the steps of an ordinary request yield one to three actions, only failures and deadlines more.
    ///
    /// Built with the fixed-arity initialisers in the machine (an array literal would allocate the array
    /// it is made from; the tests use literals freely). Read by index: an iterator is a copy of the list.
    struct ActionList: RandomAccessCollection, ExpressibleByArrayLiteral, Equatable, CustomStringConvertible {
        /// Unused slots hold a payload-free action, so that copying and destroying them costs little.
        /// Stored properties, not a tuple: a tuple of enums is copied through the runtime's generic tuple
        /// witness, several times slower.
        private var slot0 = Action.cancelConnectionWait, slot1 = Action.cancelConnectionWait, slot2 = Action.cancelConnectionWait
        /// Optional, so that a list without it destroys nothing here.
        private var more: [Action]?
        private(set) var count = 0

        init() {}
        init(_ a: Action) { append(a) }
        init(_ a: Action, _ b: Action) { append(a); append(b) }
        init(_ a: Action, _ b: Action, _ c: Action) { append(a); append(b); append(c) }
        init(_ a: Action, _ b: Action, _ c: Action, _ d: Action) { append(a); append(b); append(c); append(d) }

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

        /// Moves the action at `position` out, leaving a payload-free one in its place: a driver that is done
        /// with the list takes each action instead of copying it (a copy retains what the action carries).
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

        mutating func append(contentsOf other: ActionList) {
            for index in 0..<other.count { append(other[index]) }
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
            lhs.elementsEqual(rhs)
        }

        var description: String { "\(Array(self))" }
    }
}

/// A FIFO of tickets; cancelled ones are skipped when they reach the front (amortised O(1) per ticket).
struct UpstreamWaitQueue {
    private var tickets: [UpstreamPool.Ticket] = []
    private var start = 0

    mutating func append(_ ticket: UpstreamPool.Ticket) { tickets.append(ticket) }

    mutating func popWaiting() -> UpstreamPool.Ticket? {
        defer { compact() }
        while start < tickets.count {
            let ticket = tickets[start]
            start += 1
            if ticket.isWaiting { return ticket }
        }
        return nil
    }

    /// Drops given-up tickets once they outnumber the waiting ones: while every connection stays busy
    /// (long streams), clients that time out and go away would otherwise pile up behind the front.
    mutating func pruneIfSparse(waiting: Int) {
        guard tickets.count - start > 2 * waiting + 64 else { return }
        tickets = tickets[start...].filter(\.isWaiting)
        start = 0
    }

    private mutating func compact() {
        if start == tickets.count {
            tickets.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 64 && start * 2 > tickets.count {
            tickets.removeFirst(start)
            start = 0
        }
    }
}

/// A test fixture (a listening socket, a helper process) that could not be set up.
struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

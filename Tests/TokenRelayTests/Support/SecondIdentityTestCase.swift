import Foundation
import XCTest

/// A relay test with a second identity's world beside the top level's: `b`'s own token server (rotation and
/// reuse detection), its API, and its token file seeded with the tokens `b`'s server issued first. Each
/// subclass writes the config that puts `b` behind a route.
class SecondIdentityTestCase: ReloadTestCase {
    var tokenServerB: FakeTokenServer!
    var apiB: FakeAPIServer!
    var tokenFileB: URL { workDir.appendingPathComponent("tokens-b.json") }
    /// The tokens written to `tokenFileB` at set-up.
    var initialB: (access: String, refresh: String)!

    override func setUpWithError() throws {
        try super.setUpWithError()
        tokenServerB = try FakeTokenServer(clientID: "legacy-app", clientSecret: Self.clientSecret, accessTokenLifetime: 3600, expectedClientAuth: .basic)
        apiB = stoppedInTearDown(try FakeAPIServer(tokenServer: tokenServerB))
        initialB = tokenServerB.issueInitialTokens()
        try writeTokenFile(at: tokenFileB, access: initialB.access, refresh: initialB.refresh)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        tokenServerB?.stop()
    }
}

import ArgumentParser
import FoundationEssentials
import TokenRelay

/// `tokenrelay login`: the device authorization grant, for the first tokens on a host without a browser.
struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sign in with the OAuth 2.0 device authorization grant (RFC 8628) and write the token file.")

    @OptionGroup var options: ConfigOption

    @Option(help: "The entry of identities to sign in (default: the top-level refresh and login).")
    var identity: String?

    /// Tests shorten the protocol's waits (5 s between polls, 5 s more per slow_down) with this.
    @Option(help: .hidden)
    var pollIntervalScale: Double = 1

    func validate() throws {
        guard pollIntervalScale > 0 && pollIntervalScale <= 1 else { throw ValidationError("--poll-interval-scale must be in (0, 1]") }
    }

    func run() throws {
        let report = try failOnError {
            try DeviceLogin.run(configPath: options.config, identity: identity, intervalScale: pollIntervalScale) { line in
                // Unbuffered: the operator needs the code now, not when the process exits.
                StandardStreams.writeOut(line + "\n")
            }
        }
        print(report)
    }
}

import ArgumentParser
import FoundationEssentials
import Glibc
import TokenRelay

/// `tokenrelay token show|import`: inspect and seed the token file without ever putting a token on the
/// command line or the screen.
struct TokenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract: "Inspect or import the token file.",
        subcommands: [Show.self, Import.self]
    )

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the token file's state: fingerprints (SHA-256 prefixes), expiry, time left, refresh token, mode, owner.")

        @OptionGroup var options: ConfigOption

        @Option(help: "The entry of identities to work on (default: the top-level tokens).")
        var identity: String?

        func run() throws {
            print(try failOnError { try TokenFileReport.show(configPath: options.config, identity: identity) })
        }
    }

    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write the token file (atomically, mode 0600) from JSON on standard input or in a file; never from arguments.")

        @OptionGroup var options: ConfigOption

        @Option(help: "The entry of identities to work on (default: the top-level tokens).")
        var identity: String?

        @Option(help: "Read the tokens from this file instead of standard input.")
        var from: String?

        func run() throws {
            let input = try failOnError { () throws -> Data in
                if let from {
                    guard let data = FileManager.default.contents(atPath: from) else {
                        throw ValidationError("cannot read \(from): \(String(cString: strerror(errno)))")
                    }
                    return data
                }
                return Data(StandardStreams.readAllInput())
            }
            print(try failOnError { try TokenImport.run(configPath: options.config, identity: identity, input: input) })
        }
    }
}

import ArgumentParser
import FoundationEssentials
import Logging
import TokenRelay

@main
struct TokenRelayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokenrelay",
        abstract: "A reverse proxy that injects short-lived access tokens and refreshes them once, however many requests fail.",
        version: TokenRelayVersion.current,
        subcommands: [Run.self, Check.self, TokenCommand.self, Login.self, Demo.self]
    )
}

struct ConfigOption: ParsableArguments {
    @Option(name: .long, help: "Path of the JSON configuration file.")
    var config: String
}

struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the proxy in the foreground until SIGTERM or SIGINT; SIGHUP reloads the config and the client secret.")

    @OptionGroup var options: ConfigOption

    func run() throws {
        // First, before the preflight builds TLS contexts: reloads build them on helper threads.
        OpenSSLProcessState.keepUntilExit()
        let preflight = try failOnError { try Preflight.run(configPath: options.config) }
        let redactor = SecretRedactor()
        let logLevel = LogLevelControl(Logger.Level(rawValue: preflight.config.logLevel) ?? .info)
        let logger = bootstrapLogging(level: logLevel, format: preflight.config.logFormat, redactor: redactor)
        try failOnError {
            try Relay.run(preflight: preflight, redactor: redactor, logger: logger,
                          reloadSource: ReloadSource(configPath: options.config, logLevel: logLevel))
        }
    }
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Validate the config, the client secret and the token file, like nginx -t.")

    @OptionGroup var options: ConfigOption

    func run() throws {
        let preflight = try failOnError { try Preflight.run(configPath: options.config) }
        print(preflight.summary + preflight.credentialFileWarnings)
    }
}

struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run tokenrelay in front of a built-in demo API and token server (2-second tokens, rotation, reuse detection).")

    @Option(help: "Stop after this many seconds (default: run until Ctrl-C).")
    var seconds: Double?

    @Flag(help: "Three relays sharing one identity through a local redis-server (fleet mode).")
    var fleet = false

    func run() throws {
        let redactor = SecretRedactor()
        let logger = bootstrapLogging(level: "info", redactor: redactor)
        if fleet {
            try failOnError { try FleetDemoRunner.run(seconds: seconds, redactor: redactor, logger: logger) }
        } else {
            try failOnError { try DemoRunner.run(seconds: seconds, redactor: redactor, logger: logger) }
        }
    }
}

/// Prints the one-line reason (it never contains a secret) and exits non-zero.
func failOnError<T>(_ body: () throws -> T) throws -> T {
    do {
        return try body()
    } catch let error as ConfigError {
        StandardStreams.writeError("tokenrelay: config error: \(error)\n")
        throw ExitCode(2)
    } catch {
        StandardStreams.writeError("tokenrelay: \(error)\n")
        throw ExitCode(1)
    }
}

func bootstrapLogging(level: String, format: LogFormat = .text, redactor: SecretRedactor) -> Logger {
    bootstrapLogging(level: LogLevelControl(Logger.Level(rawValue: level) ?? .info), format: format, redactor: redactor)
}

/// Every logger follows `level`, which a reload may change.
func bootstrapLogging(level: LogLevelControl, format: LogFormat = .text, redactor: SecretRedactor) -> Logger {
    LoggingSystem.bootstrap { _ in LineLogHandler(levelControl: level, format: format, redactor: redactor) }
    return Logger(label: "tokenrelay")
}

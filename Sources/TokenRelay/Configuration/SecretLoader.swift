import FoundationEssentials
import Glibc

/// Resolves the client secret from where the config says it lives; the secret never sits in the config.
public enum SecretLoader {
    public static func load(_ source: Config.Refresh.SecretSource?) throws -> String? {
        switch source {
        case nil:
            return nil
        case .environment(let name)?:
            guard let value = ProcessInfo.processInfo.environment[name] else {
                throw ConfigError("refresh.client_secret_env", "environment variable \(name) is not set")
            }
            // Set but empty is a different mistake (an unfilled template, `NAME=` in an env file).
            guard !value.isEmpty else { throw ConfigError("refresh.client_secret_env", "environment variable \(name) is empty") }
            return value
        case .file(let path)?:
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ConfigError("refresh.client_secret_file", "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            guard let decoded = String(data: data, encoding: .utf8) else {
                throw ConfigError("refresh.client_secret_file", "\(path) is not UTF-8 text")
            }
            // A trailing newline is an artefact of `echo secret > file`, not part of the secret.
            let text = decoded.trimmingNewlines()
            guard !text.isEmpty else { throw ConfigError("refresh.client_secret_file", "\(path) is empty") }
            return text
        }
    }
}

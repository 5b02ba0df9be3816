import FoundationEssentials
import Glibc

/// Writes the tokens a device login obtained: the proxy's own atomic 0600 writer, under the token file
/// lock, keeping the keys of an existing file that tokenrelay does not interpret (as a refresh would).
enum LoginTokenFile {
    /// Fails early — before the user is asked to sign in — when the file could not be written at all:
    /// a login that succeeds and then has nowhere to put its tokens wastes the user's time.
    static func checkWritable(_ path: String) throws {
        let directory = FilePath.parent(of: path).isEmpty ? "." : FilePath.parent(of: path)
        guard access(directory, W_OK) == 0 else {
            throw TokenFileError(path, "directory \(directory) is not writable: \(String(cString: strerror(errno)))")
        }
    }

    /// `adding`: fields to write beside the kept ones (the DPoP key the login signed with, kept with the token
    /// state). The login's key wins over one the file holds now: the tokens written are bound to it. Race it
    /// prevents: a relay wrote its own generated key with tokens of its own while the user was signing in; keeping
    /// that key beside the login's tokens would store a key and tokens that do not belong together.
    static func write(_ grant: TokenGrant, to file: TokenFile, adding: [String: Any] = [:], now: Date = Date()) throws {
        try TokenFileLock.withBlockingLock(tokenFilePath: file.path) {
            let fields = keptFields(of: file).merging(adding) { _, added in added }
            try file.write(TokenSet(accessToken: "", otherFields: fields).renewed(by: grant, now: now).tokens)
        }
    }

    /// Read raw rather than through `TokenFile.load`: the old file may be exactly what the login is
    /// replacing (expired, half-seeded, refused), and it must not stand in the way.
    /// A sealed file is opened with the configured keys; one that does not open keeps nothing.
    static func keptFields(of file: TokenFile) -> [String: Any] {
        guard let data = FileManager.default.contents(atPath: file.path),
              var object = (try? JSONReader.parse(data)) as? [String: Any] else { return [:] }
        if SealedTokenState.isSealed(object) {
            guard let opened = try? file.codec.decode(data, name: file.path) else { return [:] }
            object = opened.otherFields
        }
        for key in ["access_token", "refresh_token", "expires_at"] { object[key] = nil }
        return object
    }
}

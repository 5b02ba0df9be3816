import FoundationEssentials
import Glibc

/// A helper program started with `posix_spawnp` (stdin, stdout and stderr on /dev/null), for the demo's
/// redis-server: the part of Foundation's `Process` the demo used.
final class ChildProcess {
    let pid: pid_t
    private var exited = false

    struct SpawnError: Error, CustomStringConvertible {
        let description: String
    }

    /// `program` is looked up in PATH; the child inherits our environment.
    init(program: String, arguments: [String]) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd: Int32 in [STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO] {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY, 0)
        }
        let argv = ([program] + arguments).map { strdup($0) } + [nil]
        let envp = ProcessInfo.processInfo.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var child = pid_t()
        let result = posix_spawnp(&child, program, &actions, nil, argv, envp)
        guard result == 0 else { throw SpawnError(description: "cannot start \(program): \(String(cString: strerror(result)))") }
        pid = child
    }

    /// False once the child has exited (and been reaped).
    var isRunning: Bool {
        guard !exited else { return false }
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == pid { exited = true }
        return !exited
    }

    func terminate() {
        if !exited { kill(pid, SIGTERM) }
    }

    func waitUntilExit() {
        guard !exited else { return }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        exited = true
    }
}

// transport-bench-relay LISTEN_PORT UPSTREAM_PORT TOKEN: see BenchRelay.swift (bench/run.sh only).
import HTTPTransport
import Glibc

let arguments = CommandLine.arguments
guard arguments.count == 4, let listenPort = UInt16(arguments[1]), let upstreamPort = UInt16(arguments[2]) else {
    print("usage: transport-bench-relay LISTEN_PORT UPSTREAM_PORT TOKEN")
    exit(2)
}
runBenchRelay(listenPort: listenPort, upstreamPort: upstreamPort, token: arguments[3])

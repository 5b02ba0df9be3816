// fleet-burst-load: the native clients and upstream of bench/fleet_burst.py (bench only); see Run.swift.
import Glibc

let arguments = Array(CommandLine.arguments.dropFirst())
switch arguments.first {
case "upstream":
    runUpstream()
case "burst":
    let numbers = arguments.dropFirst().compactMap { Int($0) }
    guard numbers.count >= 2, numbers.count == arguments.count - 1, numbers[0] > 0,
          numbers.dropFirst().allSatisfy({ (1...65535).contains($0) }) else {
        print("usage: fleet-burst-load burst COUNT PORT...")
        exit(2)
    }
    runBurst(count: numbers[0], ports: numbers.dropFirst().map { UInt16($0) })
default:
    print("usage: fleet-burst-load upstream | burst COUNT PORT...")
    exit(2)
}

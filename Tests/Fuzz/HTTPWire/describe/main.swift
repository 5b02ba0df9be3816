// Prints how HTTPWire reads each file named on the command line as a request head, one line per file
// (the format of requestOutcome in FuzzEntry.swift). Built by scripts/fuzz for the differential test.
#if canImport(Glibc)
import Glibc
#endif

for path in CommandLine.arguments.dropFirst() {
    guard let file = fopen(path, "rb") else {
        print("cannot open \(path)")
        exit(2)
    }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = fread(&chunk, 1, chunk.count, file)
        if n <= 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
    }
    fclose(file)
    print(requestOutcome(bytes, splits: []))
}

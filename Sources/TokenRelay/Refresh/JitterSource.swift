/// Uniform numbers in 0..<1 that spread retries and proactive refreshes over a fleet. They guard nothing,
/// so they come from a SplitMix64 stream seeded once from the system generator: drawing from the system
/// generator at every clock reading cost one getrandom(2) per reading, two per proxied request.
struct JitterSource {
    private var state: UInt64

    init(seed: UInt64 = UInt64.random(in: .min ... .max)) {
        state = seed
    }

    mutating func next() -> Double {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        mixed ^= mixed >> 31
        // The top 53 bits, as a Double in 0..<1.
        return Double(mixed >> 11) / Double(UInt64(1) << 53)
    }
}

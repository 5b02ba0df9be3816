public enum TokenRelayVersion {
    public static let current = "0.1.0"
}

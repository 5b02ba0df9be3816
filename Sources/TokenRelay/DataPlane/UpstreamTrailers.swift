/// The trailer fields of an HTTP/2 upstream's response, as Swift values (names lower-case, as received).
/// What the gRPC refresh decision reads: a call's status is in its trailers.
struct UpstreamTrailers {
    var fields: [(name: String, value: String)]
    /// No DATA byte of the response arrived before them: a Trailers-Only response (`trailersOnly`) or a
    /// HEADERS frame, then the trailers, with no message between.
    var beforeAnyData: Bool
    /// The response was one HEADERS frame with END_STREAM: `fields` are the head's own fields.
    var trailersOnly: Bool

    /// The first field of that name (give it lower-case).
    func field(_ name: String) -> String? {
        fields.first { $0.name == name }?.value
    }
}

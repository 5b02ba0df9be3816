extension ConfigLoader {
    static func readForwarding(_ object: JSONObjectReader) throws -> Config.Forwarding {
        var forwarding = Config.Forwarding()
        if let value = try object.optionalBool("x_forwarded_for") { forwarding.xForwardedFor = value }
        if let value = try object.optionalBool("x_forwarded_proto") { forwarding.xForwardedProto = value }
        if let value = try object.optionalBool("via") { forwarding.via = value }
        if let value = try object.optionalBool("drop_underscore_headers") { forwarding.dropUnderscoreHeaders = value }
        try object.rejectUnknownKeys()
        return forwarding
    }
}

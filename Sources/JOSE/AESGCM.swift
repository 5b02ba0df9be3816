internal import CJOSECrypto

/// AES-256-GCM, 12-byte nonce, 16-byte tag (the token state sealed at rest). The caller chooses the nonce:
/// a fresh `SecureRandom.bytes(12)` per seal, since a nonce used twice with one key gives the key stream away.
public enum AESGCM {
    public static func seal(key: [UInt8], nonce: [UInt8], plaintext: [UInt8], associatedData: [UInt8]) throws -> (ciphertext: [UInt8], tag: [UInt8]) {
        try checkSizes(key: key, nonce: nonce)
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count)
        var tag = [UInt8](repeating: 0, count: 16)
        let ok = key.withUnsafeBufferPointer { key in
            nonce.withUnsafeBufferPointer { nonce in
                plaintext.withUnsafeBufferPointer { plaintext in
                    associatedData.withUnsafeBufferPointer { aad in
                        ciphertext.withUnsafeMutableBufferPointer { ciphertext in
                            tag.withUnsafeMutableBufferPointer { tag in
                                jose_aes256gcm_seal(key.baseAddress, nonce.baseAddress, plaintext.baseAddress, plaintext.count,
                                                    aad.baseAddress, aad.count, ciphertext.baseAddress, tag.baseAddress)
                            }
                        }
                    }
                }
            }
        }
        guard ok == 1 else { throw JOSEError("AES-256-GCM sealing failed") }
        return (ciphertext, tag)
    }

    /// tag failure → JOSEError("authentication tag does not match")
    public static func open(key: [UInt8], nonce: [UInt8], ciphertext: [UInt8], tag: [UInt8], associatedData: [UInt8]) throws -> [UInt8] {
        try checkSizes(key: key, nonce: nonce)
        guard tag.count == 16 else { throw JOSEError("an AES-256-GCM tag has 16 bytes, not \(tag.count)") }
        var plaintext = [UInt8](repeating: 0, count: ciphertext.count)
        let result = key.withUnsafeBufferPointer { key in
            nonce.withUnsafeBufferPointer { nonce in
                ciphertext.withUnsafeBufferPointer { ciphertext in
                    associatedData.withUnsafeBufferPointer { aad in
                        tag.withUnsafeBufferPointer { tag in
                            plaintext.withUnsafeMutableBufferPointer { plaintext in
                                jose_aes256gcm_open(key.baseAddress, nonce.baseAddress, ciphertext.baseAddress, ciphertext.count,
                                                    aad.baseAddress, aad.count, tag.baseAddress, plaintext.baseAddress)
                            }
                        }
                    }
                }
            }
        }
        switch result {
        case 1: return plaintext
        case 0: throw JOSEError("authentication tag does not match")
        default: throw JOSEError("AES-256-GCM opening failed")
        }
    }

    private static func checkSizes(key: [UInt8], nonce: [UInt8]) throws {
        guard key.count == 32 else { throw JOSEError("an AES-256-GCM key has 32 bytes, not \(key.count)") }
        guard nonce.count == 12 else { throw JOSEError("an AES-256-GCM nonce has 12 bytes, not \(nonce.count)") }
    }
}

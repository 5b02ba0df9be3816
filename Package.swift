// swift-tools-version:6.0
import PackageDescription

// Release builds (scripts/demo, scripts/test's CI build, the container image) link the Swift runtime and
// FoundationEssentials statically: no shared libswiftCore pages to map at start (bench/README.md, "Idle
// memory"), and nothing but libevent, OpenSSL, hiredis and libc to install beside the binary. The targets
// that import FoundationEssentials must be compiled with the flag too, or their objects name the shared
// runtime's link dependencies and the static link misses _FoundationCollections. Debug and test builds keep
// the shared runtime. (`--static-swift-stdlib` on the command line, as the Containerfile passes it, agrees.)
let staticRuntimeInRelease: [SwiftSetting] = [.unsafeFlags(["-static-stdlib"], .when(configuration: .release))]

let package = Package(
    name: "tokenrelay",
    platforms: [.macOS(.v13)],
    products: [
        .executable(name: "tokenrelay", targets: ["tokenrelay"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
    ],
    targets: [
        // libevent (+ openssl, pthreads) as found by pkg-config; linking is spelled out in the modulemap
        // because libevent_openssl.pc lists -lssl -lcrypto only in Libs.private.
        .systemLibrary(
            name: "CLibevent",
            pkgConfig: "libevent_openssl",
            providers: [.apt(["libevent-dev", "libssl-dev"])]
        ),
        // hiredis' RESP reply reader and command formatter (fleet mode's Redis store); imported by
        // RedisProtocol only.
        .systemLibrary(
            name: "CHiredis",
            pkgConfig: "hiredis",
            providers: [.apt(["libhiredis-dev"])]
        ),
        // nghttp2 (framing, HPACK, flow control, stream states of HTTP/2; docs/nghttp2.md): imported by
        // HTTPTransport only, which runs it over its own sockets beside the HTTP/1.1 parser.
        .systemLibrary(
            name: "CNghttp2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        // RESP as Swift values over CHiredis (reply reader, command formatter); no I/O: the bytes travel
        // on HTTPTransport's byte stream (TokenStore/RedisConnection.swift).
        .target(name: "RedisProtocol", dependencies: ["CHiredis"], swiftSettings: staticRuntimeInRelease),
        // OpenSSL 3 EVP for JOSE: PEM key load, key generation, JWS signing, public JWK components,
        // AES-256-GCM, RAND_bytes, SHA-2 (docs/openssl-crypto.md). Imported by JOSE only.
        .target(name: "CJOSECrypto", linkerSettings: [.linkedLibrary("crypto")]),
        // base64url, JWS compact serialisation, signing keys and their RFC 7638 thumbprints, AES-256-GCM:
        // Swift types over CJOSECrypto, no C type in its public API.
        .target(name: "JOSE", dependencies: ["CJOSECrypto"], swiftSettings: staticRuntimeInRelease),
        .target(
            name: "TokenRelay",
            dependencies: [
                "RedisProtocol",
                // JWS signing, key loading, AES-256-GCM sealing: the only way to OpenSSL's EVP outside HTTPTransport.
                "JOSE",
                // Every socket, timer, signal and TLS session; the only way to libevent and OpenSSL.
                "HTTPTransport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: staticRuntimeInRelease
        ),
        // HTTP/1.1 message syntax (heads, framing, chunked bodies): pure Swift, no I/O, no C module.
        .target(name: "HTTPWire"),
        // Connection-level HTTP/1.1 on libevent's event API (no evhttp), and the loop's timers, signals and
        // wake-ups: the one target that imports CLibevent. Its public API has no libevent types.
        .target(name: "CTransportSocket"),
        // Release builds skip the run-time exclusivity checks here (about 45 per proxied request, 5 % of its
        // instructions): the transport runs on one thread, and debug builds, which the tests use, keep them.
        .target(name: "HTTPTransport", dependencies: ["HTTPWire", "CLibevent", "CTransportSocket", "CNghttp2"],
                swiftSettings: [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]),
        // A minimal relay on HTTPTransport that bench/run.sh measures beside nginx and tokenrelay (bench only).
        .executableTarget(name: "transport-bench-relay", dependencies: ["HTTPTransport", "HTTPWire"]),
        // The clients and upstream of bench/fleet_burst.py's burst, natively (bench only): Python's were the
        // larger part of the release figure it measures.
        .executableTarget(name: "fleet-burst-load", dependencies: ["HTTPTransport"]),
        .executableTarget(
            name: "tokenrelay",
            dependencies: [
                "TokenRelay",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: staticRuntimeInRelease,
            linkerSettings: [.unsafeFlags(["-static-stdlib"], .when(configuration: .release))]
        ),
        // The TLS fixtures both test targets share: a throwaway PKI and the Python HTTPS server
        // (tls_server.py, run from the source tree and located via #filePath, not a resource).
        .target(name: "TLSFixtures", path: "Tests/TLSFixtures", exclude: ["tls_server.py"]),
        .testTarget(
            name: "TokenRelayTests",
            dependencies: ["TokenRelay", "TLSFixtures"],
            // Helper programs the tests run from the source tree (located via #filePath), not resources.
            exclude: ["Fixtures"]
        ),
        .testTarget(name: "HTTPWireTests", dependencies: ["HTTPWire"]),
        .testTarget(name: "JOSETests", dependencies: ["JOSE"]),
        .testTarget(
            name: "HTTPTransportTests",
            dependencies: ["HTTPTransport", "HTTPWire", "TLSFixtures"]
        ),
    ]
)

import Foundation
import TLSFixtures
import XCTest

/// `refresh.client_auth: tls_client_auth` (RFC 8705 §2.1): the `refresh.tls` client certificate
/// authenticates; the form names the client and carries no secret.
final class TLSClientAuthTests: CredentialTestCase {
    func testTheClientCertificateAuthenticates() throws {
        let pki = try TestPKI.shared()
        let endpoint = try startEndpoint(["client_auth": "tls_client_auth", "cert": pki.server.cert.path, "key": pki.server.key.path,
                                          "client_ca": pki.caFile.path, "client_cn": TestPKI.clientCommonName])
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "tls_client_auth"],
                                   tls: ["ca_file": pki.caFile.path, "client_cert": pki.client.cert.path, "client_key": pki.client.key.path])
        XCTAssertEqual(try get(relay).status, 200)
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.strings("refusals"), [])
        XCTAssertEqual(endpoint.granted, 2)
        XCTAssertEqual(endpoint.strings("client_cns"), [TestPKI.clientCommonName, TestPKI.clientCommonName])
        let form = try XCTUnwrap(endpoint.forms.first)
        XCTAssertEqual(form["client_id"], Self.clientID)
        XCTAssertNil(form["client_secret"])
        XCTAssertNil(form["client_assertion"])
    }
}

@testable import TokenRelay
import XCTest

/// `log.access_query` logs the query, but never the values of credential-like parameters a client put in it.
final class QueryRedactionTests: XCTestCase {
    func testCredentialValuesAreRedactedAndTheRestKept() {
        XCTAssertEqual(QueryRedaction.redact("/orders/7?access_token=eyJabc&page=2"), "/orders/7?access_token=[redacted]&page=2")
        XCTAssertEqual(QueryRedaction.redact("/f?X-Amz-Signature=ab12&X-Amz-Credential=AKIA%2F&x=1"),
                       "/f?X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted]&x=1")
        XCTAssertEqual(QueryRedaction.redact("/cb?code=s3cr3t&state=xyz"), "/cb?code=[redacted]&state=xyz")
        XCTAssertEqual(QueryRedaction.redact("/a?API_KEY=k&Password=p&client_secret=c&sid=1"),
                       "/a?API_KEY=[redacted]&Password=[redacted]&client_secret=[redacted]&sid=1")
    }

    func testOddQueriesPassUnchanged() {
        XCTAssertEqual(QueryRedaction.redact("/plain"), "/plain")
        XCTAssertEqual(QueryRedaction.redact("/p?"), "/p?")
        XCTAssertEqual(QueryRedaction.redact("/p?flag&&page=1&=v"), "/p?flag&&page=1&=v")
        XCTAssertEqual(QueryRedaction.redact("/p?token=a=b"), "/p?token=[redacted]")
    }

    /// What an application server would read as a credential parameter is redacted however the query
    /// spells it: a name written with percent-escapes (`%74oken` is `token` once decoded), and parameters
    /// separated by `;` (which many servers and older query parsers split on like `&`).
    func testEncodedNamesAndSemicolonSeparatedParametersAreRedacted() {
        XCTAssertEqual(QueryRedaction.redact("/a?%74oken=s3cr3t&page=2"), "/a?%74oken=[redacted]&page=2")
        XCTAssertEqual(QueryRedaction.redact("/a?api%5Fk%65y=s3cr3t"), "/a?api%5Fk%65y=[redacted]")
        XCTAssertEqual(QueryRedaction.redact("/a?page=1;access_token=s3cr3t"), "/a?page=1;access_token=[redacted]")
        XCTAssertEqual(QueryRedaction.redact("/a?x=%zz;y=1&pass%77ord=p"), "/a?x=%zz;y=1&pass%77ord=[redacted]")
        XCTAssertEqual(QueryRedaction.redact("/a?page=1;;%=2"), "/a?page=1;;%=2")
    }

    /// A request target has no fragment (RFC 9112 section 3.2), but a client that forwards a whole URL sends
    /// one, and the implicit grant puts `access_token` there: it is a query for the log's purposes. With the
    /// query left out, so is the fragment; with it logged, its credential parameters are redacted.
    func testAFragmentIsTreatedAsQuery() {
        XCTAssertEqual(AccessLogEntry.loggedPath("/cb#access_token=s3cr3t&state=1", includeQuery: false), "/cb")
        XCTAssertEqual(AccessLogEntry.loggedPath("/cb?x=1#access_token=s3cr3t", includeQuery: false), "/cb")
        XCTAssertEqual(AccessLogEntry.loggedPath("/cb#access_token=s3cr3t&state=1", includeQuery: true),
                       "/cb#access_token=[redacted]&state=1")
        XCTAssertEqual(AccessLogEntry.loggedPath("/cb?x=1#access_token=s3cr3t", includeQuery: true), "/cb?x=1#access_token=[redacted]")
        XCTAssertEqual(AccessLogEntry.loggedPath("http://u:p@h/cb?token=t", includeQuery: true), "/cb?token=[redacted]")
        XCTAssertEqual(AccessLogEntry.loggedPath(nil, includeQuery: true), "-")
    }
}

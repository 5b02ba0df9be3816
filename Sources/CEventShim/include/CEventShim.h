#ifndef TOKENRELAY_CEVENTSHIM_H
#define TOKENRELAY_CEVENTSHIM_H

// Forward declarations only: this header must not pull libevent or OpenSSL headers into a second Clang
// module (libevent's event-config.h defines _GNU_SOURCE, which makes glibc types differ between modules).
#include <stddef.h>

struct evhttp_request;

/// HTTP minor version of a request. libevent 2.1 has no getter for it, and the proxy needs it
/// to frame responses for HTTP/1.0 clients correctly (docs/evhttp.md, http10-framing).
int tr_evhttp_request_minor(struct evhttp_request *req);
/// HTTP major version of a request (evhttp accepts any 1.x and would answer HTTP/1.2 in kind).
int tr_evhttp_request_major(struct evhttp_request *req);
/// evhttp writes its answer in the request's version; an unsupported one is answered as HTTP/1.1.
void tr_evhttp_request_answer_as_http11(struct evhttp_request *req);

/// SHA-256 of `count` bytes into `digest` (32 bytes) without OpenSSL's provider machinery; 1 on success.
int tr_sha256(const unsigned char *data, size_t count, unsigned char *digest);

#endif

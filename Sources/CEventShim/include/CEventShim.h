#ifndef TOKENRELAY_CEVENTSHIM_H
#define TOKENRELAY_CEVENTSHIM_H

#include <event2/http.h>
#include <openssl/ssl.h>

/// HTTP minor version of a request. libevent 2.1 has no getter for it, and the proxy needs it
/// to frame responses for HTTP/1.0 clients correctly (see shared notes, P16).
int tr_evhttp_request_minor(struct evhttp_request *req);

/// OpenSSL exposes these as function-like macros, which Swift does not import.
long tr_ssl_set_tlsext_host_name(SSL *ssl, const char *name);
long tr_ssl_ctx_set_min_proto_version(SSL_CTX *ctx, int version);

#endif

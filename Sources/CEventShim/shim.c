#include <event2/http.h>
#include <event2/http_struct.h>
#include <openssl/ssl.h>

#include "CEventShim.h"

int tr_evhttp_request_minor(struct evhttp_request *req) {
    return req->minor;
}

int tr_evhttp_request_major(struct evhttp_request *req) {
    return req->major;
}

void tr_evhttp_request_answer_as_http11(struct evhttp_request *req) {
    req->major = 1;
    req->minor = 1;
}

long tr_ssl_set_tlsext_host_name(SSL *ssl, const char *name) {
    return SSL_set_tlsext_host_name(ssl, name);
}

long tr_ssl_ctx_set_min_proto_version(SSL_CTX *ctx, int version) {
    return SSL_CTX_set_min_proto_version(ctx, version);
}

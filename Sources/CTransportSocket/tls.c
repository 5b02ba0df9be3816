#include <openssl/ssl.h>
#include "CTransportSocket.h"

int transport_tls_configure_client_context(SSL_CTX *ctx) {
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) return 0;
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    /* Read-ahead: one read(2) takes whatever the socket holds into OpenSSL's record buffer, so a record's
       header and body arrive in one system call instead of two (docs/data-plane.md, "Reading TLS"). */
    SSL_CTX_set_read_ahead(ctx, 1);
    /* Sessions go to the new-session callback only (TLSSessionCache); OpenSSL's own store would keep them all. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    return 1;
}

int transport_tls_set_server_name(SSL *ssl, const char *name) {
    return SSL_set_tlsext_host_name(ssl, name) == 1;
}

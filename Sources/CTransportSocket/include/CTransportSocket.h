#ifndef TOKENRELAY_CTRANSPORTSOCKET_H
#define TOKENRELAY_CTRANSPORTSOCKET_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/socket.h>

/// accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC): accept4 is declared only with _GNU_SOURCE,
/// which this file's users must not define (it changes glibc's types for the whole Swift module).
int transport_accept_nonblocking(int fd, struct sockaddr *addr, socklen_t *len);

/// pipe2(fds, O_NONBLOCK | O_CLOEXEC), fcntl(fd, F_SETPIPE_SZ, bytes) (returns the capacity granted, or
/// -1) and splice(from, NULL, to, NULL, count, SPLICE_F_MOVE | SPLICE_F_NONBLOCK): Linux-only, and the
/// latter two need _GNU_SOURCE for the same reason as accept4.
int transport_pipe_nonblocking(int fds[2]);
int transport_pipe_set_capacity(int fd, int bytes);
ssize_t transport_splice(int from, int to, size_t count);

// OpenSSL types are only forward-declared: OpenSSL's headers stay out of this module (they reach Swift
// through CLibevent once, so that both modules agree on glibc's feature macros).
struct ssl_st;
struct ssl_ctx_st;

/// What OpenSSL spells as function-like macros, which Swift does not import. Sets TLS 1.2 as the
/// minimum, refuses renegotiation, treats a close without close_notify as end of input (HTTP's framing
/// decides whether a body is complete), and lets a write be partial and be retried from a moved buffer
/// (our output queue), and hands every new client session to the context's new-session callback without
/// keeping it in OpenSSL's internal cache. Returns 1 on success.
int transport_tls_configure_client_context(struct ssl_ctx_st *ctx);
/// SNI. Returns 1 on success.
int transport_tls_set_server_name(struct ssl_st *ssl, const char *name);

/// SHA-256 of `count` bytes into `digest` (32 bytes) without OpenSSL's provider machinery; 1 on success.
int transport_sha256(const unsigned char *data, size_t count, unsigned char *digest);

/// Gives malloc's whole free pages back to the kernel (after a burst's buffers were freed).
void transport_release_free_memory(void);

#endif

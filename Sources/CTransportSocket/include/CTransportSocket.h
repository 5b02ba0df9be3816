#ifndef TOKENRELAY_CTRANSPORTSOCKET_H
#define TOKENRELAY_CTRANSPORTSOCKET_H

#include <sys/types.h>
#include <sys/socket.h>

/// accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC): accept4 is declared only with _GNU_SOURCE,
/// which this file's users must not define (it changes glibc's types for the whole Swift module).
int transport_accept_nonblocking(int fd, struct sockaddr *addr, socklen_t *len);

#endif

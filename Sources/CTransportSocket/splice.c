#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include "CTransportSocket.h"

int transport_pipe_nonblocking(int fds[2]) {
    return pipe2(fds, O_NONBLOCK | O_CLOEXEC);
}

int transport_pipe_set_capacity(int fd, int bytes) {
    return fcntl(fd, F_SETPIPE_SZ, bytes);
}

ssize_t transport_splice(int from, int to, size_t count) {
    return splice(from, NULL, to, NULL, count, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
}

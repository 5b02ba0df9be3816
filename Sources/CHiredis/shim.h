#ifndef TOKENRELAY_CHIREDIS_SHIM_H
#define TOKENRELAY_CHIREDIS_SHIM_H

// Only the RESP reply reader and the command formatter: tokenrelay moves the bytes itself over
// HTTPTransport's byte stream (see docs/redis.md), so hiredis' own sockets and async adapters stay out.
#include <sys/types.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#endif

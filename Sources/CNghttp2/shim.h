#ifndef TOKENRELAY_CNGHTTP2_SHIM_H
#define TOKENRELAY_CNGHTTP2_SHIM_H

// A system header first, so that glibc's feature macros are fixed the same way for every module (see
// CLibevent/shim.h).
#include <sys/types.h>
#include <nghttp2/nghttp2.h>

#endif

#ifndef TOKENRELAY_CLIBEVENT_SHIM_H
#define TOKENRELAY_CLIBEVENT_SHIM_H

// libevent's event-config.h defines _GNU_SOURCE. Were it the first to reach <features.h>, glibc types
// such as fd_set would be declared differently here than in the Glibc and Dispatch modules, and a clean
// build fails with "'__fds_bits' from module 'CDispatch' is not present in definition of 'fd_set'".
// Including a system header first fixes glibc's feature macros the same way for every module.
#include <sys/types.h>
#include <sys/select.h>
#include <sys/time.h>

// Public libevent headers only (HTTPTransport uses the event API, evdns, and evhttp's URI parser and
// percent-encoder, which need no HTTP server or connection).
#include <event2/event.h>
#include <event2/http.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <event2/util.h>

#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <openssl/sha.h>

#endif

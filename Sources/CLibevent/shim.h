#ifndef TOKENRELAY_CLIBEVENT_SHIM_H
#define TOKENRELAY_CLIBEVENT_SHIM_H

// Public libevent headers only: http_struct.h stays out so that evhttp_request remains an
// opaque type (OpaquePointer in Swift) and nobody pokes at its fields.
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

#endif

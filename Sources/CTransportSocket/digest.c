// SHA256_Init/Update/Final are deprecated in OpenSSL 3 (see transport_sha256 for why they are used).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include "CTransportSocket.h"

// OpenSSL 3's one-shot SHA256() goes through EVP_Q_digest, whose first call initialises the library
// context, reads the OpenSSL config file and loads the default provider: about 2 MiB of resident pages
// in an otherwise idle tokenrelay, for a fingerprint. The SHA256_Init/Update/Final functions compute
// the same digest directly. They are deprecated in 3.0 (in favour of EVP) but still part of the API.

int transport_sha256(const unsigned char *data, size_t count, unsigned char *digest) {
    SHA256_CTX context;
    if (SHA256_Init(&context) != 1) return 0;
    if (SHA256_Update(&context, data, count) != 1) return 0;
    return SHA256_Final(digest, &context);
}

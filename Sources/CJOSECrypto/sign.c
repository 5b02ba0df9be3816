#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include "CJOSECrypto.h"

// JWS signatures through EVP_DigestSign. ECDSA comes out of OpenSSL DER-encoded (SEQUENCE of two
// INTEGERs, minimal length); JWS wants r and s as two fixed-width big-endian numbers, so a short r or s
// is left-padded with zeros (about one signature in 128 has a leading zero byte).

static int fail(const char **reason, const char *why) {
    ERR_clear_error();
    if (reason) *reason = why;
    return 0;
}

size_t jose_signature_capacity(const struct evp_pkey_st *key) {
    int size = EVP_PKEY_get_size(key);
    return size > 0 ? (size_t)size : 0;
}

static int der_to_raw(const uint8_t *der, size_t der_count, size_t width, uint8_t *out, size_t *count) {
    if (*count < 2 * width) return 0;
    const unsigned char *cursor = der;
    ECDSA_SIG *parsed = d2i_ECDSA_SIG(NULL, &cursor, (long)der_count);
    if (parsed == NULL) return 0;
    const BIGNUM *r = NULL, *s = NULL;
    ECDSA_SIG_get0(parsed, &r, &s);
    int ok = cursor == der + der_count && r != NULL && s != NULL
          && (size_t)BN_num_bytes(r) <= width && (size_t)BN_num_bytes(s) <= width
          && BN_bn2binpad(r, out, (int)width) == (int)width
          && BN_bn2binpad(s, out + width, (int)width) == (int)width;
    ECDSA_SIG_free(parsed);
    if (ok) *count = 2 * width;
    return ok;
}

// Checks the key against `alg` and initialises `context` for it (digest, padding). `*width`: the ECDSA
// coordinate width, 0 for the others.
static int prepare(EVP_MD_CTX *context, struct evp_pkey_st *key, int alg, size_t *width, const char **reason) {
    int kind = jose_key_kind(key, NULL);
    const char *digest = "SHA256";
    *width = 0;
    switch (alg) {
    case JOSE_ALG_ES256: if (kind != JOSE_KEY_EC_P256) return fail(reason, "ES256 needs an EC P-256 key"); *width = 32; break;
    case JOSE_ALG_ES384: if (kind != JOSE_KEY_EC_P384) return fail(reason, "ES384 needs an EC P-384 key"); *width = 48; digest = "SHA384"; break;
    case JOSE_ALG_EDDSA: if (kind != JOSE_KEY_ED25519) return fail(reason, "EdDSA needs an Ed25519 key"); digest = NULL; break;
    case JOSE_ALG_RS256: if (kind != JOSE_KEY_RSA) return fail(reason, "RS256 needs an RSA key"); break;
    case JOSE_ALG_PS256: if (kind != JOSE_KEY_RSA) return fail(reason, "PS256 needs an RSA key"); break;
    default: return fail(reason, "unknown algorithm");
    }
    EVP_PKEY_CTX *key_context = NULL;   // owned by `context`
    int ok = EVP_DigestSignInit_ex(context, &key_context, digest, NULL, NULL, key, NULL) == 1;
    if (ok && alg == JOSE_ALG_RS256) ok = EVP_PKEY_CTX_set_rsa_padding(key_context, RSA_PKCS1_PADDING) == 1;
    if (ok && alg == JOSE_ALG_PS256) {
        ok = EVP_PKEY_CTX_set_rsa_padding(key_context, RSA_PKCS1_PSS_PADDING) == 1
          && EVP_PKEY_CTX_set_rsa_mgf1_md_name(key_context, "SHA256", NULL) == 1
          && EVP_PKEY_CTX_set_rsa_pss_saltlen(key_context, 32) == 1;
    }
    return ok ? 1 : fail(reason, "signing failed");
}

// One-shot EVP_DigestSign on an initialised context: Ed25519 (pure EdDSA) supports nothing else, and it
// serves the others too.
static int sign_prepared(EVP_MD_CTX *context, size_t width, const uint8_t *message, size_t message_count,
                         uint8_t *signature, size_t *count, const char **reason) {
    static const uint8_t nothing = 0;
    if (message == NULL) message = &nothing;   // an empty message is legal; OpenSSL wants a pointer
    uint8_t der[160];   // a P-384 DER signature is at most 104 bytes
    size_t length = width ? sizeof der : *count;
    if (EVP_DigestSign(context, width ? der : signature, &length, message, message_count) != 1) return fail(reason, "signing failed");
    if (width) {
        if (!der_to_raw(der, length, width, signature, count)) return fail(reason, "signing failed (malformed ECDSA signature)");
    } else {
        *count = length;
    }
    return 1;
}

int jose_sign(struct evp_pkey_st *key, int alg, const uint8_t *message, size_t message_count,
              uint8_t *signature, size_t *count, const char **reason) {
    EVP_MD_CTX *context = EVP_MD_CTX_new();
    if (context == NULL) return fail(reason, "out of memory");
    size_t width = 0;
    int ok = prepare(context, key, alg, &width, reason)
          && sign_prepared(context, width, message, message_count, signature, count, reason);
    EVP_MD_CTX_free(context);
    return ok;
}

// A context initialised once per key and algorithm (the digest and signature implementations fetched from
// the provider, the key's provider data bound): each signature then signs on a copy of it, which skips
// the fetches and look-ups of an init. Each signature still draws its own ECDSA nonce (inside
// EVP_DigestSign, on the copy): nothing random is prepared ahead or shared between signatures.
//
// ECDSA goes further: the message is hashed on one digest context re-initialised per signature with the
// digest fetched once, and the hash signed by EVP_PKEY_sign on one key context initialised once: no
// context allocated, copied or freed per signature. EVP_PKEY_sign draws a fresh nonce on every call (the
// key context keeps no k or r between calls unless a known-answer test sets them, which we never do).
struct jose_prepared {
    EVP_MD_CTX *template;
    size_t width;
    EVP_MD *digest;             // ECDSA only, else NULL (and the template path signs)
    EVP_MD_CTX *hashing;
    EVP_PKEY_CTX *signing;
};

static void prepare_ecdsa(struct jose_prepared *prepared, struct evp_pkey_st *key) {
    prepared->digest = EVP_MD_fetch(NULL, prepared->width == 32 ? "SHA256" : "SHA384", NULL);
    prepared->hashing = EVP_MD_CTX_new();
    prepared->signing = EVP_PKEY_CTX_new_from_pkey(NULL, key, NULL);
    if (prepared->digest == NULL || prepared->hashing == NULL || prepared->signing == NULL || EVP_PKEY_sign_init(prepared->signing) != 1) {
        // The template path still signs: a failure here only costs speed.
        EVP_MD_free(prepared->digest);
        EVP_MD_CTX_free(prepared->hashing);
        EVP_PKEY_CTX_free(prepared->signing);
        prepared->digest = NULL;
        prepared->hashing = NULL;
        prepared->signing = NULL;
        ERR_clear_error();
    }
}

struct jose_prepared *jose_prepared_new(struct evp_pkey_st *key, int alg, const char **reason) {
    struct jose_prepared *prepared = OPENSSL_zalloc(sizeof *prepared);
    if (prepared == NULL) { fail(reason, "out of memory"); return NULL; }
    prepared->template = EVP_MD_CTX_new();
    if (prepared->template == NULL || !prepare(prepared->template, key, alg, &prepared->width, reason)) {
        if (prepared->template == NULL) fail(reason, "out of memory");
        jose_prepared_free(prepared);
        return NULL;
    }
    if (prepared->width) prepare_ecdsa(prepared, key);
    return prepared;
}

static int sign_ecdsa(const struct jose_prepared *prepared, const uint8_t *message, size_t message_count,
                      uint8_t *signature, size_t *count, const char **reason) {
    unsigned char hash[EVP_MAX_MD_SIZE];
    unsigned int hash_count = 0;
    if (EVP_DigestInit_ex2(prepared->hashing, prepared->digest, NULL) != 1
        || EVP_DigestUpdate(prepared->hashing, message, message_count) != 1
        || EVP_DigestFinal_ex(prepared->hashing, hash, &hash_count) != 1) return fail(reason, "signing failed (digest)");
    uint8_t der[160];   // a P-384 DER signature is at most 104 bytes
    size_t length = sizeof der;
    if (EVP_PKEY_sign(prepared->signing, der, &length, hash, hash_count) != 1) return fail(reason, "signing failed");
    if (!der_to_raw(der, length, prepared->width, signature, count)) return fail(reason, "signing failed (malformed ECDSA signature)");
    return 1;
}

int jose_prepared_sign(const struct jose_prepared *prepared, const uint8_t *message, size_t message_count,
                       uint8_t *signature, size_t *count, const char **reason) {
    if (prepared->signing != NULL) return sign_ecdsa(prepared, message, message_count, signature, count, reason);
    EVP_MD_CTX *context = EVP_MD_CTX_new();
    if (context == NULL) return fail(reason, "out of memory");
    int ok = EVP_MD_CTX_copy_ex(context, prepared->template) == 1
          ? sign_prepared(context, prepared->width, message, message_count, signature, count, reason)
          : fail(reason, "signing failed (cannot copy the prepared context)");
    EVP_MD_CTX_free(context);
    return ok;
}

void jose_prepared_free(struct jose_prepared *prepared) {
    if (prepared == NULL) return;
    EVP_MD_CTX_free(prepared->template);
    EVP_MD_free(prepared->digest);
    EVP_MD_CTX_free(prepared->hashing);
    EVP_PKEY_CTX_free(prepared->signing);
    OPENSSL_free(prepared);
}

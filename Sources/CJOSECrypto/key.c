#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include "CJOSECrypto.h"

// Key loading, generation and export. Each function clears OpenSSL's per-thread error queue when it
// fails (see the header: a stale entry would be read by the next SSL_get_error on this thread).

static struct evp_pkey_st *fail_key(EVP_PKEY *key, const char **reason, const char *why) {
    EVP_PKEY_free(key);
    ERR_clear_error();
    if (reason) *reason = why;
    return NULL;
}

// OpenSSL asks for a passphrase only when the PEM block is encrypted: decline, and remember that it asked,
// so the caller can say "encrypted" rather than "not a key". The flag lives in the caller's stack frame.
static int refuse_passphrase(char *buffer, int size, int writing, void *asked) {
    (void)buffer; (void)size; (void)writing;
    *(int *)asked = 1;
    return -1;
}

int jose_key_kind(const struct evp_pkey_st *key, int *bits) {
    if (bits) *bits = EVP_PKEY_get_bits(key);
    if (EVP_PKEY_is_a(key, "RSA")) return JOSE_KEY_RSA;
    if (EVP_PKEY_is_a(key, "ED25519")) return JOSE_KEY_ED25519;
    if (EVP_PKEY_is_a(key, "EC")) {
        char group[64];
        size_t length = 0;
        if (EVP_PKEY_get_group_name(key, group, sizeof group, &length) != 1) { ERR_clear_error(); return JOSE_KEY_UNSUPPORTED; }
        if (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0) return JOSE_KEY_EC_P256;
        if (strcmp(group, "secp384r1") == 0 || strcmp(group, "P-384") == 0) return JOSE_KEY_EC_P384;
    }
    return JOSE_KEY_UNSUPPORTED;
}

struct evp_pkey_st *jose_key_from_pem(const uint8_t *pem, size_t count, const char **reason) {
    if (pem == NULL || count == 0) return fail_key(NULL, reason, "the file is empty");
    if (count > INT_MAX) return fail_key(NULL, reason, "the file is too large for a PEM key");
    BIO *bio = BIO_new_mem_buf(pem, (int)count);
    if (bio == NULL) return fail_key(NULL, reason, "out of memory");
    int asked = 0;
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, refuse_passphrase, &asked);
    BIO_free(bio);
    if (key == NULL) {
        return fail_key(NULL, reason, asked ? "the key is encrypted (a passphrase-protected key is not supported: store it unencrypted, readable only by tokenrelay)"
                                            : "no PEM private key found (expected PKCS#8 'PRIVATE KEY', 'RSA PRIVATE KEY' or 'EC PRIVATE KEY')");
    }
    if (jose_key_kind(key, NULL) == JOSE_KEY_UNSUPPORTED)
        return fail_key(key, reason, "unsupported key type (expected RSA, EC P-256, EC P-384 or Ed25519)");
    return key;
}

struct evp_pkey_st *jose_key_generate(int kind, int rsa_bits, const char **reason) {
    const char *name = kind == JOSE_KEY_RSA ? "RSA" : kind == JOSE_KEY_ED25519 ? "ED25519"
                     : (kind == JOSE_KEY_EC_P256 || kind == JOSE_KEY_EC_P384) ? "EC" : NULL;
    if (name == NULL) return fail_key(NULL, reason, "unsupported key type");
    EVP_PKEY_CTX *context = EVP_PKEY_CTX_new_from_name(NULL, name, NULL);
    if (context == NULL) return fail_key(NULL, reason, "key generation is unavailable");
    EVP_PKEY *key = NULL;
    int ok = EVP_PKEY_keygen_init(context) == 1;
    if (ok && kind == JOSE_KEY_RSA) ok = EVP_PKEY_CTX_set_rsa_keygen_bits(context, rsa_bits) == 1;
    if (ok && kind == JOSE_KEY_EC_P256) ok = EVP_PKEY_CTX_set_group_name(context, "P-256") == 1;
    if (ok && kind == JOSE_KEY_EC_P384) ok = EVP_PKEY_CTX_set_group_name(context, "P-384") == 1;
    if (ok) ok = EVP_PKEY_generate(context, &key) == 1;
    EVP_PKEY_CTX_free(context);
    if (!ok) return fail_key(key, reason, "key generation failed");
    return key;
}

void jose_key_free(struct evp_pkey_st *key) {
    EVP_PKEY_free(key);
}

// Writes one BIGNUM parameter big-endian: `width` 0 means its minimal length, otherwise left-padded with
// zeros to exactly `width` bytes (EC coordinates have a fixed width in a JWK).
static int export_bn(const EVP_PKEY *key, const char *name, size_t width, uint8_t *out, size_t *count) {
    BIGNUM *value = NULL;
    if (EVP_PKEY_get_bn_param(key, name, &value) != 1) { ERR_clear_error(); return 0; }
    size_t length = (size_t)BN_num_bytes(value);
    int ok = 0;
    if (width == 0) width = length;
    if (length <= width && width <= *count && width <= INT_MAX) {
        ok = BN_bn2binpad(value, out, (int)width) == (int)width;
        *count = width;
    }
    BN_free(value);
    if (!ok) ERR_clear_error();
    return ok;
}

int jose_public_component(const struct evp_pkey_st *key, int component, uint8_t *out, size_t *count) {
    int bits = 0;
    switch (jose_key_kind(key, &bits)) {
    case JOSE_KEY_RSA:
        return export_bn(key, component == 0 ? OSSL_PKEY_PARAM_RSA_N : OSSL_PKEY_PARAM_RSA_E, 0, out, count);
    case JOSE_KEY_EC_P256:
    case JOSE_KEY_EC_P384:
        return export_bn(key, component == 0 ? OSSL_PKEY_PARAM_EC_PUB_X : OSSL_PKEY_PARAM_EC_PUB_Y, (size_t)(bits + 7) / 8, out, count);
    case JOSE_KEY_ED25519:
        if (component != 0) return 0;
        if (EVP_PKEY_get_raw_public_key(key, out, count) != 1) { ERR_clear_error(); return 0; }
        return 1;
    default:
        return 0;
    }
}

int jose_private_key_pem(const struct evp_pkey_st *key, uint8_t **pem, size_t *count) {
    // A secure-memory BIO: its buffer is wiped when freed (it holds the private key in clear).
    BIO *bio = BIO_new(BIO_s_secmem());
    if (bio == NULL) { ERR_clear_error(); return 0; }
    int ok = PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL) == 1;
    char *data = NULL;
    long length = ok ? BIO_get_mem_data(bio, &data) : 0;
    ok = ok && length > 0 && data != NULL;
    uint8_t *copy = ok ? malloc((size_t)length) : NULL;
    if (copy != NULL) {
        memcpy(copy, data, (size_t)length);
        *pem = copy;
        *count = (size_t)length;
    }
    BIO_free(bio);
    if (copy == NULL) { ERR_clear_error(); return 0; }
    return 1;
}

void jose_bytes_free(uint8_t *bytes, size_t count) {
    if (bytes == NULL) return;
    OPENSSL_cleanse(bytes, count);
    free(bytes);
}

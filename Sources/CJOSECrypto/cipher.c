#include <limits.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include "CJOSECrypto.h"

// AES-256-GCM, random bytes and digests. GCM's tag is not part of the ciphertext in EVP: seal reads it
// after EncryptFinal (GET_TAG), open sets the expected tag before DecryptFinal (SET_TAG), and it is
// DecryptFinal's result that says whether the tag matched.

static const uint8_t nothing = 0;   // OpenSSL wants a pointer even for zero bytes

int jose_aes256gcm_seal(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *plaintext, size_t count,
                        const uint8_t *aad, size_t aad_count, uint8_t *ciphertext, uint8_t tag[16]) {
    if (count > INT_MAX || aad_count > INT_MAX) return 0;
    EVP_CIPHER_CTX *context = EVP_CIPHER_CTX_new();
    if (context == NULL) { ERR_clear_error(); return 0; }
    int length = 0, ok = EVP_EncryptInit_ex2(context, EVP_aes_256_gcm(), key, nonce, NULL) == 1;
    if (ok && aad_count > 0) ok = EVP_EncryptUpdate(context, NULL, &length, aad, (int)aad_count) == 1;
    int written = 0;
    if (ok && count > 0) { ok = EVP_EncryptUpdate(context, ciphertext, &length, plaintext, (int)count) == 1; written = length; }
    uint8_t end[16];   // GCM is a stream mode: Final writes nothing, but give it room anyway
    if (ok) ok = EVP_EncryptFinal_ex(context, end, &length) == 1 && length == 0 && (size_t)written == count;
    if (ok) ok = EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
    EVP_CIPHER_CTX_free(context);
    if (!ok) ERR_clear_error();
    return ok;
}

int jose_aes256gcm_open(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *ciphertext, size_t count,
                        const uint8_t *aad, size_t aad_count, const uint8_t tag[16], uint8_t *plaintext) {
    if (count > INT_MAX || aad_count > INT_MAX) return -1;
    EVP_CIPHER_CTX *context = EVP_CIPHER_CTX_new();
    if (context == NULL) { ERR_clear_error(); return -1; }
    uint8_t expected[16];
    memcpy(expected, tag, sizeof expected);   // the ctrl call takes a non-const pointer
    int length = 0, written = 0, ok = EVP_DecryptInit_ex2(context, EVP_aes_256_gcm(), key, nonce, NULL) == 1;
    if (ok) ok = EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, 16, expected) == 1;
    if (ok && aad_count > 0) ok = EVP_DecryptUpdate(context, NULL, &length, aad, (int)aad_count) == 1;
    if (ok && count > 0) { ok = EVP_DecryptUpdate(context, plaintext, &length, ciphertext, (int)count) == 1; written = length; }
    int result = ok ? 1 : -1;
    uint8_t end[16];
    if (ok && (EVP_DecryptFinal_ex(context, end, &length) != 1 || length != 0 || (size_t)written != count)) result = 0;
    EVP_CIPHER_CTX_free(context);
    if (result != 1) {
        ERR_clear_error();
        if (count > 0) OPENSSL_cleanse(plaintext, count);   // unauthenticated bytes are never handed out
    }
    return result;
}

int jose_random(uint8_t *out, size_t count) {
    if (count == 0) return 1;
    if (count > INT_MAX) return 0;
    if (RAND_bytes(out, (int)count) != 1) { ERR_clear_error(); return 0; }
    return 1;
}

static int digest(const EVP_MD *md, const uint8_t *data, size_t count, uint8_t *out) {
    if (data == NULL) data = &nothing;
    if (EVP_Digest(data, count, out, NULL, md, NULL) != 1) { ERR_clear_error(); return 0; }
    return 1;
}

int jose_sha256(const uint8_t *data, size_t count, uint8_t out[32]) { return digest(EVP_sha256(), data, count, out); }
int jose_sha384(const uint8_t *data, size_t count, uint8_t out[48]) { return digest(EVP_sha384(), data, count, out); }

int jose_errors_pending(void) { return ERR_peek_error() != 0; }

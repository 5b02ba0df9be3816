#ifndef TOKENRELAY_CJOSECRYPTO_H
#define TOKENRELAY_CJOSECRYPTO_H

#include <stddef.h>
#include <stdint.h>

// The OpenSSL EVP calls the JOSE module needs, each a small checked C function. OpenSSL's headers stay
// out of this header (EVP_PKEY is only forward-declared), so Swift sees an opaque pointer.
// Every function is reentrant: no global state here, and OpenSSL 3's EVP objects used read-only (a loaded
// key) may be shared between threads. On failure a function leaves OpenSSL's per-thread error queue
// empty, so a later TLS call on the same thread never reads a stale error from it (SSL_get_error does).
// `reason` out-parameters receive a static one-line English string (never key material).

struct evp_pkey_st;

enum jose_key_kind { JOSE_KEY_UNSUPPORTED = 0, JOSE_KEY_RSA = 1, JOSE_KEY_EC_P256 = 2, JOSE_KEY_EC_P384 = 3, JOSE_KEY_ED25519 = 4 };
enum jose_alg { JOSE_ALG_ES256 = 1, JOSE_ALG_ES384 = 2, JOSE_ALG_EDDSA = 3, JOSE_ALG_RS256 = 4, JOSE_ALG_PS256 = 5 };

/// Parses one PEM private key (PKCS#8, or traditional RSA / EC). An encrypted key is refused: the
/// passphrase callback declines and `reason` says the key is encrypted. Keys other than RSA, EC P-256/P-384
/// and Ed25519 are refused. Returns NULL with `reason` set on failure.
struct evp_pkey_st *jose_key_from_pem(const uint8_t *pem, size_t count, const char **reason);

/// A new key of `kind` (RSA: `rsa_bits`). Returns NULL with `reason` set on failure.
struct evp_pkey_st *jose_key_generate(int kind, int rsa_bits, const char **reason);

void jose_key_free(struct evp_pkey_st *key);

/// The key's kind (enum jose_key_kind); `*bits` receives the key size in bits.
int jose_key_kind(const struct evp_pkey_st *key, int *bits);

/// Upper bound of a signature's size with this key, for the buffer passed to jose_sign.
size_t jose_signature_capacity(const struct evp_pkey_st *key);

/// Signs `message` as JWS `alg` (enum jose_alg): ECDSA as fixed-width r||s, RSASSA-PKCS1-v1_5 SHA-256,
/// RSASSA-PSS SHA-256 (MGF1 SHA-256, salt 32), Ed25519 (pure). `*count` is the capacity of `signature` on
/// entry and the signature's length on return. Returns 1 on success, 0 with `reason` set.
int jose_sign(struct evp_pkey_st *key, int alg, const uint8_t *message, size_t message_count,
              uint8_t *signature, size_t *count, const char **reason);

/// A signing context prepared once per key and `alg` (see sign.c); NULL with `reason` set on failure.
struct jose_prepared;
struct jose_prepared *jose_prepared_new(struct evp_pkey_st *key, int alg, const char **reason);
/// As jose_sign, on a copy of the prepared context.
int jose_prepared_sign(const struct jose_prepared *prepared, const uint8_t *message, size_t message_count,
                       uint8_t *signature, size_t *count, const char **reason);
void jose_prepared_free(struct jose_prepared *prepared);

/// The public key's JWK components, big-endian unsigned: component 0 is RSA `n`, EC `x` (padded to the
/// coordinate width) or Ed25519's raw public key; component 1 is RSA `e` or EC `y`. `*count` is the
/// capacity on entry and the length on return. Returns 1 on success, 0 otherwise.
int jose_public_component(const struct evp_pkey_st *key, int component, uint8_t *out, size_t *count);

/// The private key as unencrypted PKCS#8 PEM in a buffer the caller releases with jose_bytes_free
/// (which wipes it). Returns 1 on success, 0 otherwise.
int jose_private_key_pem(const struct evp_pkey_st *key, uint8_t **pem, size_t *count);
void jose_bytes_free(uint8_t *bytes, size_t count);

/// AES-256-GCM with a 32-byte key, a 12-byte nonce and a 16-byte tag; `ciphertext` has `count` bytes
/// like the plaintext. seal returns 1 on success, 0 on failure. open returns 1 when the tag matches
/// (plaintext written), 0 when it does not (nothing usable in `plaintext`: it is wiped), -1 on other failure.
int jose_aes256gcm_seal(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *plaintext, size_t count,
                        const uint8_t *aad, size_t aad_count, uint8_t *ciphertext, uint8_t tag[16]);
int jose_aes256gcm_open(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *ciphertext, size_t count,
                        const uint8_t *aad, size_t aad_count, const uint8_t tag[16], uint8_t *plaintext);

/// RAND_bytes. Returns 1 on success.
int jose_random(uint8_t *out, size_t count);

/// SHA-256 (32 bytes) / SHA-384 (48 bytes) of `data`. Returns 1 on success.
int jose_sha256(const uint8_t *data, size_t count, uint8_t digest[32]);
int jose_sha384(const uint8_t *data, size_t count, uint8_t digest[48]);

/// 1 when OpenSSL's error queue of the calling thread holds an entry (for tests of the rule above).
int jose_errors_pending(void);

#endif

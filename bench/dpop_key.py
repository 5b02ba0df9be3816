#!/usr/bin/env python3
"""Makes a DPoP key for the benchmarks with the openssl CLI and prints its RFC 7638 thumbprint (jkt), so that
bench/run.sh and bench/profile.sh can bind the bench tokens to it (a proof signed per request).

    bench/dpop_key.py ALG OUT.pem      # ALG: ES256, ES384, EdDSA, RS256, PS256

Also `bench/dpop_key.py --speed ALG`: the `openssl speed` algorithm name that times one signature of ALG
(RS256 and PS256 both time the RSA-2048 private-key operation, which is what either padding costs).
"""
import base64
import hashlib
import json
import subprocess
import sys

GENPKEY = {
    "ES256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    "ES384": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
    "EdDSA": ["-algorithm", "ED25519"],
    "RS256": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    "PS256": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
}
SPEED = {"ES256": "ecdsap256", "ES384": "ecdsap384", "EdDSA": "ed25519", "RS256": "rsa2048", "PS256": "rsa2048"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(alg: str, pem: str) -> dict:
    if alg in ("RS256", "PS256"):
        modulus = subprocess.run(["openssl", "rsa", "-in", pem, "-noout", "-modulus"], check=True,
                                 capture_output=True, text=True).stdout.strip().split("=", 1)[1]
        return {"e": "AQAB", "kty": "RSA", "n": b64(bytes.fromhex(modulus))}
    der = subprocess.run(["openssl", "pkey", "-in", pem, "-pubout", "-outform", "DER"], check=True, capture_output=True).stdout
    if alg == "EdDSA":
        return {"crv": "Ed25519", "kty": "OKP", "x": b64(der[-32:])}
    size = 32 if alg == "ES256" else 48  # the uncompressed point ends the DER: x then y
    return {"crv": "P-256" if alg == "ES256" else "P-384", "kty": "EC", "x": b64(der[-2 * size:-size]), "y": b64(der[-size:])}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--speed" and sys.argv[2] in SPEED:
        print(SPEED[sys.argv[2]])
        return 0
    if len(sys.argv) != 3 or sys.argv[1] not in GENPKEY:
        print("usage: dpop_key.py ES256|ES384|EdDSA|RS256|PS256 OUT.pem  |  dpop_key.py --speed ALG", file=sys.stderr)
        return 2
    alg, pem = sys.argv[1], sys.argv[2]
    subprocess.run(["openssl", "genpkey", *GENPKEY[alg], "-out", pem], check=True, capture_output=True)
    jwk = public_jwk(alg, pem)
    print(b64(hashlib.sha256(json.dumps(jwk, separators=(",", ":"), sort_keys=True).encode()).digest()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

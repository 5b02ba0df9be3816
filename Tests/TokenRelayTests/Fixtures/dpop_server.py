#!/usr/bin/env python3
"""A strict DPoP (RFC 9449) authorization server and resource server for tokenrelay's DPoP tests. Every proof
is verified with python3 `cryptography` (independent of tokenrelay's JOSE code) against the `jwk` in its header.

Listens on 127.0.0.1, ports 0: the token endpoint, the API and a control port for the test.
Prints "TOKEN_PORT API_PORT CONTROL_PORT" as the first line on stdout. Configured by one JSON file (argv[1]):

  refresh_token          the refresh token a test puts in the token file (unbound until its first use)
  access_token_lifetime  seconds (default 3600)
  token_nonce            require a DPoP nonce at the token endpoint (default true); rotated every
                         token_nonce_every token requests (default 2)
  api_nonce              require a DPoP nonce at the API (default true); rotated every api_nonce_every
                         API requests (default 0: only by POST /rotate-api-nonce). The current and the previous
                         nonce are accepted (a request in flight while it rotates is not refused twice).
  token_type             what the token endpoint answers (default "DPoP")
  token_nonce_value / api_nonce_value   a fixed nonce (never rotated): a bad one (huge, non-ASCII, a quote) tests
                         that tokenrelay refuses it and never repeats it
  require_proof          false: a token request without a DPoP proof still gets token_type DPoP (a server
                         tokenrelay must refuse when `dpop` is not configured)

Proof rules (both sides): header typ "dpop+jwt", alg one of ES256/ES384/EdDSA/RS256/PS256, a public jwk (no private
member), signature valid with that jwk; claims htm = the request method, htu = this server's URL of the request
without query and fragment, iat within 60 s of now, a jti never seen before (on either side), nonce as required.
Token endpoint: grant_type=refresh_token; refresh tokens rotate, a reused one revokes the family (reuse detection),
and a refresh token is bound to the jkt of the proof that obtained it (a proof with another key is refused).
Access tokens carry cnf.jkt: the API checks the proof's key thumbprint against it, and ath = b64url(sha256(token)).
An expired access token gets 401 WWW-Authenticate: DPoP error="invalid_token".

Device login (RFC 8628): POST /device on the token port answers a device code (no proof needed); the token endpoint
answers its grant (urn:ietf:params:oauth:grant-type:device_code) authorization_pending device_pending_polls times
(default 1), then tokens bound to the proof's key, with the same proof and nonce rules as a refresh.

Control: GET /stats (JSON), POST /expire (every access token issued so far stops being valid),
POST /rotate-api-nonce.
"""
import base64
import hashlib
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

settings = json.load(open(sys.argv[1]))
lock = threading.RLock()
stats = {"token_requests": 0, "granted": 0, "token_nonce_challenges": 0, "api_requests": 0, "api_ok": 0,
         "api_nonce_challenges": 0, "api_invalid_token": 0, "jti_reuse": 0, "refresh_token_reuse": 0,
         "proof_failures": [], "jkts": [], "bearer_requests": 0,
         "device_requests": 0, "device_polls": 0, "device_granted": 0}
seen_jti = set()
refresh_tokens = {settings["refresh_token"]: {"jkt": None, "used": False, "family": "f0"}}
revoked_families = set()
access_tokens = {}   # token -> {"jkt", "expires"}
token_nonce = {"current": settings.get("token_nonce_value") or secrets.token_urlsafe(12), "count": 0}
api_nonce = {"current": settings.get("api_nonce_value") or secrets.token_urlsafe(12), "previous": None, "count": 0}
ports = {}


def b64d(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64e(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def thumbprint(jwk):
    members = {"EC": ("crv", "kty", "x", "y"), "OKP": ("crv", "kty", "x"), "RSA": ("e", "kty", "n")}[jwk["kty"]]
    canonical = json.dumps({k: jwk[k] for k in members}, separators=(",", ":"), sort_keys=True)
    return b64e(hashlib.sha256(canonical.encode()).digest())


def verify_signature(alg, jwk, signing_input, signature):
    if alg in ("ES256", "ES384"):
        curve, digest, width = (ec.SECP256R1(), hashes.SHA256(), 32) if alg == "ES256" else (ec.SECP384R1(), hashes.SHA384(), 48)
        if jwk.get("kty") != "EC" or len(signature) != 2 * width:
            raise ValueError("bad EC key or signature length")
        key = ec.EllipticCurvePublicNumbers(int.from_bytes(b64d(jwk["x"]), "big"), int.from_bytes(b64d(jwk["y"]), "big"), curve).public_key()
        der = encode_dss_signature(int.from_bytes(signature[:width], "big"), int.from_bytes(signature[width:], "big"))
        key.verify(der, signing_input, ec.ECDSA(digest))
    elif alg == "EdDSA":
        ed25519.Ed25519PublicKey.from_public_bytes(b64d(jwk["x"])).verify(signature, signing_input)
    elif alg in ("RS256", "PS256"):
        key = rsa.RSAPublicNumbers(int.from_bytes(b64d(jwk["e"]), "big"), int.from_bytes(b64d(jwk["n"]), "big")).public_key()
        pad = padding.PKCS1v15() if alg == "RS256" else padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32)
        key.verify(signature, signing_input, pad, hashes.SHA256())
    else:
        raise ValueError("alg")


def check_proof(proof, method, htu):
    """The proof's claims and jkt, or raises ValueError with the reason."""
    if not proof:
        raise ValueError("no DPoP header")
    parts = proof.split(".")
    if len(parts) != 3:
        raise ValueError("not a compact JWS")
    header = json.loads(b64d(parts[0]))
    claims = json.loads(b64d(parts[1]))
    if header.get("typ") != "dpop+jwt":
        raise ValueError("typ")
    jwk = header.get("jwk")
    if not isinstance(jwk, dict) or any(k in jwk for k in ("d", "p", "q", "dp", "dq", "qi")):
        raise ValueError("jwk")
    try:
        verify_signature(header.get("alg"), jwk, (parts[0] + "." + parts[1]).encode(), b64d(parts[2]))
    except (InvalidSignature, ValueError, KeyError) as error:
        raise ValueError("signature: %r" % error)
    if claims.get("htm") != method:
        raise ValueError("htm %r" % claims.get("htm"))
    if claims.get("htu") != htu:
        raise ValueError("htu %r != %r" % (claims.get("htu"), htu))
    if not isinstance(claims.get("iat"), int) or abs(claims["iat"] - time.time()) > 60:
        raise ValueError("iat")
    jti = claims.get("jti")
    if not isinstance(jti, str) or len(jti) < 16:
        raise ValueError("jti")
    with lock:
        if jti in seen_jti:
            stats["jti_reuse"] += 1
            raise ValueError("jti reused")
        seen_jti.add(jti)
    return claims, thumbprint(jwk)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def fail(self, reason):
        with lock:
            stats["proof_failures"].append(reason)

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PUT(self):
        self.route("PUT")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, method):
        port = self.server.server_address[1]
        if port == ports["token"]:
            return self.token(method)
        if port == ports["api"]:
            return self.api(method)
        return self.control(method)

    def token(self, method):
        form = urllib.parse.parse_qs(self.body().decode())
        if self.path == "/device":
            with lock:
                stats["device_requests"] += 1
            return self.reply(200, {"device_code": "dc-secret", "user_code": "WDJB-MJHT", "verification_uri": "http://127.0.0.1/activate",
                                    "expires_in": 600, "interval": 1})
        with lock:
            stats["token_requests"] += 1
        try:
            if not self.headers.get("DPoP") and not settings.get("require_proof", True):
                claims, jkt = {"nonce": token_nonce["current"]}, None
            else:
                claims, jkt = check_proof(self.headers.get("DPoP"), method, "http://127.0.0.1:%d/token" % ports["token"])
        except ValueError as error:
            self.fail("token: %s" % error)
            return self.reply(400, {"error": "invalid_dpop_proof"})
        if claims.get("ath") is not None:
            self.fail("token: ath on a token request")
        with lock:
            if settings.get("token_nonce", True) and claims.get("nonce") != token_nonce["current"]:
                stats["token_nonce_challenges"] += 1
                return self.reply(400, {"error": "use_dpop_nonce"}, [("DPoP-Nonce", token_nonce["current"])])
            token_nonce["count"] += 1
            if token_nonce["count"] % settings.get("token_nonce_every", 2) == 0 and not settings.get("token_nonce_value"):
                token_nonce["current"] = secrets.token_urlsafe(12)
            if form.get("grant_type") == ["urn:ietf:params:oauth:grant-type:device_code"]:
                if form.get("device_code") != ["dc-secret"] or stats["device_granted"]:
                    return self.reply(400, {"error": "invalid_grant"}, [("DPoP-Nonce", token_nonce["current"])])
                stats["device_polls"] += 1
                if stats["device_polls"] <= settings.get("device_pending_polls", 1):
                    return self.reply(400, {"error": "authorization_pending"}, [("DPoP-Nonce", token_nonce["current"])])
                stats["device_granted"] += 1
                record = {"jkt": None, "used": False, "family": "device"}
                form["grant_type"], form["refresh_token"] = ["refresh_token"], ["device"]
                refresh_tokens["device"] = record
            presented = (form.get("refresh_token") or [""])[0]
            record = refresh_tokens.get(presented)
            if form.get("grant_type") != ["refresh_token"] or record is None or record["family"] in revoked_families:
                return self.reply(400, {"error": "invalid_grant"}, [("DPoP-Nonce", token_nonce["current"])])
            if record["used"]:
                stats["refresh_token_reuse"] += 1
                revoked_families.add(record["family"])
                return self.reply(400, {"error": "invalid_grant", "error_description": "refresh token reused"})
            if record["jkt"] is not None and record["jkt"] != jkt:
                self.fail("token: refresh token bound to another key")
                return self.reply(400, {"error": "invalid_grant"})
            record["used"] = True
            access = "at-" + secrets.token_urlsafe(16)
            refresh = "rt-" + secrets.token_urlsafe(16)
            refresh_tokens[refresh] = {"jkt": jkt, "used": False, "family": record["family"]}
            lifetime = settings.get("access_token_lifetime", 3600)
            access_tokens[access] = {"jkt": jkt, "expires": time.time() + lifetime}
            stats["granted"] += 1
            stats["jkts"].append(jkt)
            nonce = token_nonce["current"]
        self.reply(200, {"access_token": access, "refresh_token": refresh, "token_type": settings.get("token_type", "DPoP"),
                         "expires_in": lifetime}, [("DPoP-Nonce", nonce)])

    def api(self, method):
        self.body()
        path = self.path.split("?")[0].split("#")[0]
        with lock:
            stats["api_requests"] += 1
        authorization = self.headers.get("Authorization") or ""
        if not authorization.startswith("DPoP "):
            # A bearer token (the unbound one a test starts with): refused as a DPoP API would, not a proof failure.
            with lock:
                stats["bearer_requests"] += 1
            return self.reply(401, {"error": "invalid_token"}, [("WWW-Authenticate", 'DPoP error="invalid_token"')])
        token = authorization[5:]
        if len(self.headers.get_all("DPoP") or []) != 1:
            self.fail("api: %d DPoP fields" % len(self.headers.get_all("DPoP") or []))
        try:
            claims, jkt = check_proof(self.headers.get("DPoP"), method, "http://127.0.0.1:%d%s" % (ports["api"], path))
        except ValueError as error:
            self.fail("api: %s" % error)
            return self.reply(401, {"error": "invalid_dpop_proof"}, [("WWW-Authenticate", 'DPoP error="invalid_dpop_proof"')])
        with lock:
            if settings.get("api_nonce", True) and claims.get("nonce") not in [n for n in (api_nonce["current"], api_nonce["previous"]) if n]:
                stats["api_nonce_challenges"] += 1
                return self.reply(401, {"error": "use_dpop_nonce"},
                                  [("WWW-Authenticate", 'DPoP error="use_dpop_nonce", algs="ES256 EdDSA"'), ("DPoP-Nonce", api_nonce["current"])])
            record = access_tokens.get(token)
            if record is None or record["expires"] < time.time():
                stats["api_invalid_token"] += 1
                return self.reply(401, {"error": "invalid_token"}, [("WWW-Authenticate", 'DPoP error="invalid_token"')])
            if record["jkt"] != jkt:
                self.fail("api: cnf.jkt does not match the proof key")
                return self.reply(401, {"error": "invalid_token"}, [("WWW-Authenticate", 'DPoP error="invalid_token"')])
            if claims.get("ath") != b64e(hashlib.sha256(token.encode()).digest()):
                self.fail("api: ath")
                return self.reply(401, {"error": "invalid_dpop_proof"}, [("WWW-Authenticate", 'DPoP error="invalid_dpop_proof"')])
            api_nonce["count"] += 1
            every = settings.get("api_nonce_every", 0)
            if every and api_nonce["count"] % every == 0 and not settings.get("api_nonce_value"):
                api_nonce["previous"], api_nonce["current"] = api_nonce["current"], secrets.token_urlsafe(12)
            stats["api_ok"] += 1
        self.reply(200, {"ok": True, "path": path, "method": method})

    def control(self, method):
        self.body()
        with lock:
            if self.path == "/stats":
                return self.reply(200, dict(stats, seen_jtis=len(seen_jti)))
            if self.path == "/expire":
                for record in access_tokens.values():
                    record["expires"] = 0
                return self.reply(200, {})
            if self.path == "/rotate-api-nonce":
                api_nonce["previous"], api_nonce["current"] = None, secrets.token_urlsafe(12)
                return self.reply(200, {})
        self.reply(404, {})


servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(3)]
for server in servers:
    server.daemon_threads = True
ports["token"], ports["api"], ports["control"] = (s.server_address[1] for s in servers)
for server in servers[1:]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("%d %d %d" % (ports["token"], ports["api"], ports["control"]), flush=True)
servers[0].serve_forever()

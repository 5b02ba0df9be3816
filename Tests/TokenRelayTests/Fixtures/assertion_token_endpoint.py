#!/usr/bin/env python3
"""A strict OAuth 2.0 token endpoint for tokenrelay's credential tests: it checks client assertions
(RFC 7523 §2.2), jwt-bearer grants (RFC 7523 §2.1), token exchanges (RFC 8693) and mutual-TLS client
authentication (RFC 8705 §2.1) as an identity provider would, with the signatures verified by the
`cryptography` package — an implementation independent of tokenrelay's.

Listens on 127.0.0.1, ports 0 (the kernel picks): the token endpoint (HTTPS when configured) and a plain
HTTP control port for the test (/mint, /introspect, /expire, /stats; the token port answers them too).
Prints "TOKEN_PORT CONTROL_PORT" as the first line on stdout.
Configured by one JSON file (argv[1]):

  client_id            the registered client
  client_key           PEM private key whose PUBLIC half is registered for private_key_jwt (any of RSA,
                       EC P-256/P-384, Ed25519); only its public key is used. A list registers several
                       (key rotation); /stats "client_keys_used" says which one verified each assertion
  client_auth          "private_key_jwt", "tls_client_auth", "none" or "client_secret_post"
  client_secret        for client_secret_post
  audience             the `aud` a client assertion must carry; "@token_url" (the default): this endpoint's own
                       URL as tokenrelay's config names it (http://127.0.0.1:PORT/token, https://localhost:PORT/token)
  grant_key            PEM private key whose public half verifies jwt-bearer grant assertions
  grant_issuer / grant_subject / grant_audience   what a jwt-bearer assertion must claim
  federated_subject / federated_audience          what a ready-made assertion (minted here, see /mint) must
                       claim when it is presented as a client assertion (workload identity federation)
  access_token_lifetime  seconds (default 3600)
  dpop_nonce           a request with a DPoP proof whose payload lacks this nonce is answered 400
                       use_dpop_nonce with it in DPoP-Nonce — after the client was authenticated, so its
                       assertion's jti counts as seen (the proof itself is not verified here)
  cert, key, client_ca   serve HTTPS; with client_ca, require a client certificate signed by it

Paths:
  POST /token          the token endpoint; 200 with a new access token, or 400/401 with an OAuth error.
                       A client assertion must verify against the registered key, with iss = sub =
                       client_id, aud = audience, exp in the future and at most 300 s after iat, iat not in
                       the future, and a jti never seen before (a reused jti is refused: replay).
  POST /device         RFC 8628 device authorization (client authenticated as for /token); the first poll of
                       /token with its device_code grants an access and a refresh token at once
  POST /mint           {"sub", "aud", "lifetime"} -> a JWT signed by this server's own "kubelet" key
                       (ES256): a projected service-account token for the file-based tests. A negative
                       lifetime mints an expired one.
  GET  /introspect?token=T   204 if T is a current access token, else 401 (the fake API asks this)
  POST /expire         every access token issued so far stops being valid
  GET  /stats          JSON: requests, grants per type, refusals (with reasons), the client assertions and
                       subject tokens seen, the forms received (tests check what was sent)
"""
import base64
import json
import secrets
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
KUBELET_ISSUER = "https://kubernetes.default.svc.test"


def b64d(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64e(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Refused(Exception):
    def __init__(self, status, error, reason):
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def load_public(path):
    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None).public_key()


def verify_jws(token, public_key):
    """The JWT's header and claims if its signature verifies with public_key, else Refused."""
    parts = token.split(".")
    if len(parts) != 3:
        raise Refused(401, "invalid_client", "not a compact JWS")
    header, claims = json.loads(b64d(parts[0])), json.loads(b64d(parts[1]))
    signature, signing_input = b64d(parts[2]), (parts[0] + "." + parts[1]).encode()
    alg = header.get("alg")
    try:
        if isinstance(public_key, rsa.RSAPublicKey) and alg == "RS256":
            public_key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(public_key, rsa.RSAPublicKey) and alg == "PS256":
            public_key.verify(signature, signing_input, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256())
        elif isinstance(public_key, ec.EllipticCurvePublicKey) and (alg, public_key.curve.name) in (("ES256", "secp256r1"), ("ES384", "secp384r1")):
            width = 32 if alg == "ES256" else 48
            if len(signature) != 2 * width:
                raise Refused(401, "invalid_client", "ECDSA signature of the wrong length")
            r, s = int.from_bytes(signature[:width], "big"), int.from_bytes(signature[width:], "big")
            public_key.verify(encode_dss_signature(r, s), signing_input, ec.ECDSA(hashes.SHA256() if alg == "ES256" else hashes.SHA384()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey) and alg == "EdDSA":
            public_key.verify(signature, signing_input)
        else:
            raise Refused(401, "invalid_client", f"alg {alg} does not fit the registered key")
    except InvalidSignature:
        raise Refused(401, "invalid_client", "signature does not verify")
    return header, claims


class Endpoint:
    def __init__(self, config):
        self.config = config
        self.lock = threading.Lock()
        keys = config.get("client_key") or []
        self.client_keys = [load_public(path) for path in (keys if isinstance(keys, list) else [keys])]
        self.grant_key = load_public(config["grant_key"]) if config.get("grant_key") else None
        self.kubelet_key = ec.generate_private_key(ec.SECP256R1())
        self.tokens = {}
        self.seen_jtis = set()
        self.device_codes = set()
        self.refresh_tokens = {}  # current refresh token -> True; a presented one is burnt (rotation)
        self.stats = {"requests": 0, "granted": 0, "grants": {}, "refusals": [], "client_assertions": [],
                      "subject_tokens": [], "actor_tokens": [], "grant_assertions": [], "forms": [], "client_cns": [],
                      "client_keys_used": []}

    # -- the parts a test drives ------------------------------------------------------------------

    def mint(self, sub, aud, lifetime):
        now = int(time.time())
        header = {"alg": "ES256", "typ": "JWT", "kid": "kubelet"}
        claims = {"iss": KUBELET_ISSUER, "sub": sub, "aud": aud, "iat": now, "exp": now + lifetime, "jti": secrets.token_hex(8)}
        signing_input = b64e(json.dumps(header).encode()) + "." + b64e(json.dumps(claims).encode())
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
        r, s = decode_dss_signature(self.kubelet_key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return signing_input + "." + b64e(r.to_bytes(32, "big") + s.to_bytes(32, "big"))

    def introspect(self, token):
        with self.lock:
            expiry = self.tokens.get(token)
        return expiry is not None and expiry > time.time()

    def expire(self):
        with self.lock:
            self.tokens = {token: 0 for token in self.tokens}

    # -- the token endpoint ------------------------------------------------------------------------

    def check_claims(self, claims, iss, sub, aud, max_lifetime=300, kind="client assertion"):
        now = time.time()
        for name, want in (("iss", iss), ("sub", sub)):
            if claims.get(name) != want:
                raise Refused(401, "invalid_client", f"{kind} {name} {claims.get(name)!r} is not {want!r}")
        audiences = claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")]
        if aud not in audiences:
            raise Refused(401, "invalid_client", f"{kind} aud {claims.get('aud')!r} is not {aud!r}")
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int) or exp <= now:
            raise Refused(401, "invalid_client", f"{kind} expired or without exp")
        if max_lifetime is not None:
            if not isinstance(iat, int) or iat > now + 5:
                raise Refused(401, "invalid_client", f"{kind} iat missing or in the future")
            if exp - iat > max_lifetime:
                raise Refused(401, "invalid_client", f"{kind} lives {exp - iat} s, more than {max_lifetime} s")
        jti = claims.get("jti")
        if max_lifetime is not None:
            if not isinstance(jti, str) or not jti:
                raise Refused(401, "invalid_client", f"{kind} without jti")
            with self.lock:
                if jti in self.seen_jtis:
                    raise Refused(401, "invalid_client", f"{kind} jti reused (replay)")
                self.seen_jtis.add(jti)

    def authenticate_client(self, form, client_cn):
        method = self.config.get("client_auth", "none")
        client_id = self.config.get("client_id", "")
        if form.get("client_id", "") != client_id and method != "none":
            raise Refused(401, "invalid_client", f"client_id {form.get('client_id')!r} is not the registered client")
        if method == "private_key_jwt":
            if form.get("client_assertion_type") != ASSERTION_TYPE or not form.get("client_assertion"):
                raise Refused(401, "invalid_client", "no client assertion")
            if "client_secret" in form:
                raise Refused(400, "invalid_request", "a client secret beside a client assertion")
            assertion = form["client_assertion"]
            with self.lock:
                self.stats["client_assertions"].append(assertion)
            header = json.loads(b64d(assertion.split(".")[0])) if assertion.count(".") == 2 else {}
            if header.get("kid") == "kubelet":
                # Workload identity federation: a projected service-account token is the assertion.
                _, claims = verify_jws(assertion, self.kubelet_key.public_key())
                self.check_claims(claims, KUBELET_ISSUER, self.config["federated_subject"], self.config["federated_audience"],
                                  max_lifetime=None, kind="federated assertion")
            else:
                claims, refusal = None, Refused(401, "invalid_client", "no registered client key")
                for index, key in enumerate(self.client_keys):
                    try:
                        _, claims = verify_jws(assertion, key)
                    except Refused as refused:
                        refusal = refused
                        continue
                    with self.lock:
                        self.stats["client_keys_used"].append(index)
                    break
                if claims is None:
                    raise refusal
                self.check_claims(claims, client_id, client_id, self.config["audience"])
        elif method == "tls_client_auth":
            if client_cn != self.config.get("client_cn", "tls-test-client"):
                raise Refused(401, "invalid_client", f"client certificate CN {client_cn!r}")
            if "client_secret" in form or "client_assertion" in form:
                raise Refused(400, "invalid_request", "a second client credential beside the certificate")
        elif method == "client_secret_post":
            if form.get("client_secret") != self.config.get("client_secret"):
                raise Refused(401, "invalid_client", "wrong client secret")
        elif "client_secret" in form or "client_assertion" in form:
            raise Refused(400, "invalid_request", "a public client presented a credential")

    def grant(self, form):
        grant_type = form.get("grant_type")
        if grant_type == "client_credentials":
            return
        if grant_type == "urn:ietf:params:oauth:grant-type:device_code":
            with self.lock:
                if form.get("device_code") not in self.device_codes:
                    raise Refused(400, "invalid_grant", "unknown device code")
                self.device_codes.discard(form.get("device_code"))
            return
        if grant_type == "refresh_token":
            with self.lock:
                if not self.refresh_tokens.pop(form.get("refresh_token"), False):
                    raise Refused(400, "invalid_grant", "refresh token unknown or already used")
            return
        if grant_type == JWT_BEARER:
            assertion = form.get("assertion", "")
            with self.lock:
                self.stats["grant_assertions"].append(assertion)
            header = json.loads(b64d(assertion.split(".")[0])) if assertion.count(".") == 2 else {}
            if header.get("kid") == "kubelet":
                _, claims = verify_jws(assertion, self.kubelet_key.public_key())
                self.check_claims(claims, KUBELET_ISSUER, self.config["grant_subject"], self.config["grant_audience"],
                                  max_lifetime=None, kind="grant assertion")
            else:
                _, claims = verify_jws(assertion, self.grant_key)
                self.check_claims(claims, self.config["grant_issuer"], self.config["grant_subject"], self.config["grant_audience"],
                                  max_lifetime=self.config.get("grant_max_lifetime", 3600), kind="grant assertion")
                for name, want in self.config.get("grant_claims", {}).items():
                    if claims.get(name) != want:
                        raise Refused(400, "invalid_grant", f"grant assertion claim {name} is {claims.get(name)!r}")
            return
        if grant_type == TOKEN_EXCHANGE:
            subject = form.get("subject_token", "")
            with self.lock:
                self.stats["subject_tokens"].append(subject)
                if "actor_token" in form:
                    self.stats["actor_tokens"].append(form["actor_token"])
            if form.get("subject_token_type") != "urn:ietf:params:oauth:token-type:jwt":
                raise Refused(400, "invalid_request", "subject_token_type")
            try:
                _, claims = verify_jws(subject, self.kubelet_key.public_key())
            except Refused as refused:
                raise Refused(400, "invalid_grant", "subject token: " + refused.reason)
            if claims.get("exp", 0) <= time.time():
                raise Refused(400, "invalid_grant", "subject token expired")
            return
        raise Refused(400, "unsupported_grant_type", f"grant_type {grant_type!r}")

    def device(self, form, client_cn):
        try:
            self.authenticate_client(form, client_cn)
        except Refused as refused:
            with self.lock:
                self.stats["refusals"].append(refused.reason)
            return refused.status, {"error": refused.error}
        code = "dc-" + secrets.token_hex(8)
        with self.lock:
            self.device_codes.add(code)
        return 200, {"device_code": code, "user_code": "WDJB-MJHT", "verification_uri": "https://idp.test/device",
                     "expires_in": 600, "interval": 1}

    def token(self, form, client_cn, dpop=None):
        with self.lock:
            self.stats["requests"] += 1
            self.stats["forms"].append(form)
            self.stats["client_cns"].append(client_cn)
        try:
            self.authenticate_client(form, client_cn)
            nonce = self.config.get("dpop_nonce")
            if nonce and dpop and dpop.count(".") == 2 and json.loads(b64d(dpop.split(".")[1])).get("nonce") != nonce:
                with self.lock:
                    self.stats["nonce_challenges"] = self.stats.get("nonce_challenges", 0) + 1
                return 400, {"error": "use_dpop_nonce"}, {"DPoP-Nonce": nonce}
            self.grant(form)
        except Refused as refused:
            with self.lock:
                self.stats["refusals"].append(refused.reason)
            return refused.status, {"error": refused.error}, {}
        lifetime = self.config.get("access_token_lifetime", 3600)
        token = "at-" + secrets.token_hex(12)
        with self.lock:
            self.tokens[token] = time.time() + lifetime
            self.stats["granted"] += 1
            grants = self.stats["grants"]
            grants[form.get("grant_type")] = grants.get(form.get("grant_type"), 0) + 1
        answer = {"access_token": token, "token_type": "Bearer", "expires_in": lifetime}
        if form.get("grant_type") in ("refresh_token", "urn:ietf:params:oauth:grant-type:device_code"):
            answer["refresh_token"] = "rt-" + secrets.token_hex(12)
            with self.lock:
                self.refresh_tokens[answer["refresh_token"]] = True
        if form.get("grant_type") == TOKEN_EXCHANGE:
            answer["issued_token_type"] = "urn:ietf:params:oauth:token-type:access_token"
        if dpop:
            answer["token_type"] = "DPoP"
        return 200, answer, {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: without TCP_NODELAY the body waits for the peer's delayed ACK.
    disable_nagle_algorithm = True
    endpoint = None

    def log_message(self, *args):
        pass

    def client_cn(self):
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        cert = self.connection.getpeercert() or {}
        for rdn in cert.get("subject", ()):
            for name, value in rdn:
                if name == "commonName":
                    return value
        return None

    def answer(self, status, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/introspect":
            token = urllib.parse.parse_qs(url.query).get("token", [""])[0]
            return self.answer(204 if self.endpoint.introspect(token) else 401)
        if url.path == "/stats":
            with self.endpoint.lock:
                return self.answer(200, self.endpoint.stats)
        self.answer(404, {"error": "not_found"})

    def do_POST(self):
        body = self.body()
        if self.path == "/token":
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(), keep_blank_values=True).items()}
            status, answer, headers = self.endpoint.token(form, self.client_cn(), self.headers.get("DPoP"))
            return self.answer(status, answer, headers)
        if self.path == "/device":
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(), keep_blank_values=True).items()}
            status, answer = self.endpoint.device(form, self.client_cn())
            return self.answer(status, answer)
        if self.path == "/mint":
            request = json.loads(body or b"{}")
            return self.answer(200, {"token": self.endpoint.mint(request["sub"], request["aud"], int(request.get("lifetime", 3600)))})
        if self.path == "/expire":
            self.endpoint.expire()
            return self.answer(204)
        self.answer(404, {"error": "not_found"})


def main():
    with open(sys.argv[1]) as f:
        config = json.load(f)
    Handler.endpoint = Endpoint(config)
    token = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    control = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    for server in (token, control):
        server.daemon_threads = True
    if config.get("cert"):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(config["cert"], config["key"])
        if config.get("client_ca"):
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(config["client_ca"])
        token.socket = context.wrap_socket(token.socket, server_side=True)
    if config.get("audience", "@token_url") == "@token_url":
        base = "https://localhost" if config.get("cert") else "http://127.0.0.1"
        config["audience"] = f"{base}:{token.server_address[1]}/token"
    threading.Thread(target=control.serve_forever, daemon=True).start()
    print(token.server_address[1], control.server_address[1], flush=True)
    token.serve_forever()


if __name__ == "__main__":
    main()

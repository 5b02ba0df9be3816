#!/usr/bin/env python3
"""An independent, strict OAuth token endpoint and resource server: what tokenrelay sends is checked the way a real
identity provider and a DPoP-protected API would, with python3 `cryptography` and none of tokenrelay's own code or
of the other fixtures' (the DPoP probe, tokenrelay's third session on issues 20/21).

Listens on 127.0.0.1 (ports 0): token endpoint, API, control. Prints "TOKEN_PORT API_PORT CONTROL_PORT" first on
stdout. Configured by one JSON file (argv[1]); every key is optional:
  refresh_token        the refresh token the test seeds (default "rt0"); refresh tokens rotate, a reused one
                       revokes its family and is recorded as a failure
  client_id            the client id (default "c1")
  client_auth          "private_key_jwt" (default), "tls_client_auth" or "none"
  client_keys          {alg: public key PEM, or a PEM file's path} registered for client and jwt-bearer assertions
  expect_kid           the kid an assertion's header must carry
  aud                  the audience assertions must name (default: this endpoint's URL, from the Host field)
  dpop                 verify a DPoP proof on every token request (default true)
  token_type           the answer's token_type, as given (default "DPoP"; "dpop" and "bearer" are legal too)
  expires_in           the answer's expires_in, as given (an int, a string ...; default 3600)
  lifetime             seconds the API accepts an access token (default 3600)
  omit_refresh_on_refresh  answer refreshes without a refresh_token (the old one stays valid, RFC 6749 §6)
  extra                members merged into every token answer
  token_nonce / api_nonce   require a DPoP nonce at the token endpoint / the API (default false)
  rotate_token_nonce   a new token-endpoint nonce with every 200 (in DPoP-Nonce)
  api_nonce_on_ok      a new API nonce with every 200; api_nonce_window: how many earlier ones still count
  challenge            the API's nonce challenge (a WWW-Authenticate value or a list of them)
  api_base             the path the API serves under (default ""); api_on_token_port: the API is also served
                       on the token port under api_base (one origin for both servers)
  token_delay          seconds the token endpoint waits before answering
  refuse_dpop_proof    the token endpoint answers 400 invalid_dpop_proof to a good proof (an alg or clock policy)
  echo_on_reject       a refused client assertion is answered with the whole form echoed in the error
                       description and a WWW-Authenticate realm (a hostile server: nothing of it may be logged)

Checks, each refusal recorded in /stats "failures" (a test expects none):
  every JWS: three unpadded base64url segments; ES256/ES384 raw r||s of exactly 64/96 bytes, EdDSA (Ed25519),
  RS256, PS256 with MGF1-SHA256 and a salt of exactly 32 bytes, RSA at least 2048 bits.
  DPoP proofs (RFC 9449 §4.2/4.3): one DPoP field; typ "dpop+jwt"; jwk with the public members only (EC x/y of
  full width, RSA n/e without leading zero bytes); jti, htm, htu strings; iat an integer within 60 s; a jti of
  at least 16 characters never seen before (either side); htm = the method; htu = "http://" + Host + path
  without query (exactly); ath = base64url(SHA-256(token)) on the API, none on token requests; the proof's key
  thumbprint (RFC 7638) = the token's; the nonce when required (else 400/401 use_dpop_nonce + DPoP-Nonce).
  Client assertions (RFC 7523 §3, RFC 7521 §4.2): client_assertion_type exactly the jwt-bearer URN, no secret
  and no Authorization field beside it; signature by a registered key; no key in the header; iss = sub =
  client_id; aud; exp and iat integers, exp in the future and at most 300 s after iat; a jti never seen.
  Token exchange (RFC 8693): subject_token with a known subject_token_type; actor_token only with its type.
  The form: application/x-www-form-urlencoded, no field twice. The API: exactly one Authorization field, scheme
  "DPoP" for DPoP tokens ("Bearer" and no DPoP field otherwise); an unknown or expired token gets 401
  WWW-Authenticate: DPoP error="invalid_token".

Control: GET /stats (counters, failures, and every request seen: headers and form), POST /expire (every access
token issued so far stops being valid), POST /set/KEY=JSON (change a setting), POST /nonce/SIDE=VALUE.
"""
import base64, hashlib, json, secrets, sys, threading, time, urllib.parse, re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

S = json.load(open(sys.argv[1]))
lock = threading.RLock()
log = []          # every request: dict
failures = []     # strings
seen_jti = {}     # jti -> where
refresh = {S.get("refresh_token", "rt0"): {"used": False, "family": "f0", "jkt": None}}
S.setdefault("client_id", "c1")
revoked = set()
access = {}
stats = {"token_requests": 0, "granted": 0, "reuse": 0, "api_ok": 0, "api_nonce_challenges": 0, "token_nonce_challenges": 0,
         "api_invalid": 0}
nonce_state = {"token": S.get("nonce_value_token") or secrets.token_urlsafe(12), "api": S.get("nonce_value_api") or secrets.token_urlsafe(12)}
recent_api_nonces = []
B64 = re.compile(r"^[A-Za-z0-9_-]*$")


def b64d(text, what):
    if not isinstance(text, str) or not B64.match(text) or len(text) % 4 == 1:
        raise ValueError("%s: not unpadded base64url" % what)
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64e(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def fail(msg):
    with lock:
        failures.append(msg)


def verify(alg, pub, signing_input, sig):
    if alg in ("ES256", "ES384"):
        width = 32 if alg == "ES256" else 48
        if not isinstance(pub, ec.EllipticCurvePublicKey) or pub.curve.key_size != width * 8:
            raise ValueError("key/alg mismatch")
        if len(sig) != 2 * width:
            raise ValueError("%s signature is %d bytes, not raw r||s %d" % (alg, len(sig), 2 * width))
        der = encode_dss_signature(int.from_bytes(sig[:width], "big"), int.from_bytes(sig[width:], "big"))
        pub.verify(der, signing_input, ec.ECDSA(hashes.SHA256() if width == 32 else hashes.SHA384()))
    elif alg == "EdDSA":
        if not isinstance(pub, ed25519.Ed25519PublicKey):
            raise ValueError("key/alg mismatch")
        pub.verify(sig, signing_input)
    elif alg in ("RS256", "PS256"):
        if not isinstance(pub, rsa.RSAPublicKey) or pub.key_size < 2048:
            raise ValueError("key/alg mismatch")
        pad = padding.PKCS1v15() if alg == "RS256" else padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32)
        pub.verify(sig, signing_input, pad, hashes.SHA256())
    else:
        raise ValueError("alg %r not allowed" % alg)


def parse_jws(token, what):
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("%s: not three segments" % what)
    header = json.loads(b64d(parts[0], what + " header"))
    claims = json.loads(b64d(parts[1], what + " payload"))
    sig = b64d(parts[2], what + " signature")
    return header, claims, (parts[0] + "." + parts[1]).encode(), sig


def jwk_public(jwk):
    kty = jwk.get("kty")
    allowed = {"EC": {"kty", "crv", "x", "y"}, "OKP": {"kty", "crv", "x"}, "RSA": {"kty", "n", "e"}}.get(kty)
    if allowed is None:
        raise ValueError("jwk kty %r" % kty)
    extra = set(jwk) - allowed
    if extra:
        raise ValueError("jwk has members beyond the public ones: %s" % sorted(extra))
    if kty == "EC":
        curve = {"P-256": (ec.SECP256R1(), 32), "P-384": (ec.SECP384R1(), 48)}[jwk["crv"]]
        x, y = b64d(jwk["x"], "x"), b64d(jwk["y"], "y")
        if len(x) != curve[1] or len(y) != curve[1]:
            raise ValueError("EC coordinate not %d bytes" % curve[1])
        pub = ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"), curve[0]).public_key()
        members = ("crv", "kty", "x", "y")
    elif kty == "OKP":
        if jwk["crv"] != "Ed25519":
            raise ValueError("OKP crv")
        pub = ed25519.Ed25519PublicKey.from_public_bytes(b64d(jwk["x"], "x"))
        members = ("crv", "kty", "x")
    else:
        n, e = b64d(jwk["n"], "n"), b64d(jwk["e"], "e")
        if n[0] == 0 or e[0] == 0:
            raise ValueError("RSA n/e with leading zero")
        pub = rsa.RSAPublicNumbers(int.from_bytes(e, "big"), int.from_bytes(n, "big")).public_key()
        members = ("e", "kty", "n")
    canon = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    return pub, b64e(hashlib.sha256(canon.encode()).digest())


def check_proof(values, method, htu, token=None, nonce=None, where=""):
    if len(values) != 1:
        raise ValueError("%d DPoP fields" % len(values))
    header, claims, si, sig = parse_jws(values[0], "proof")
    if header.get("typ") != "dpop+jwt":
        raise ValueError("typ %r" % header.get("typ"))
    if not isinstance(header.get("jwk"), dict):
        raise ValueError("no jwk")
    pub, jkt = jwk_public(header["jwk"])
    verify(header.get("alg"), pub, si, sig)
    for name in ("jti", "htm", "htu"):
        if not isinstance(claims.get(name), str):
            raise ValueError("%s not a string" % name)
    if type(claims.get("iat")) is not int:
        raise ValueError("iat %r not an integer" % (claims.get("iat"),))
    if abs(claims["iat"] - time.time()) > 60:
        raise ValueError("iat off by %s" % (claims["iat"] - time.time()))
    if len(claims["jti"]) < 16:
        raise ValueError("jti too short %r" % claims["jti"])
    if claims["htm"] != method:
        raise ValueError("htm %r != %r" % (claims["htm"], method))
    if claims["htu"] != htu:
        raise ValueError("htu %r != %r" % (claims["htu"], htu))
    if token is not None:
        ath = b64e(hashlib.sha256(token.encode("ascii")).digest())
        if claims.get("ath") != ath:
            raise ValueError("ath %r != %r" % (claims.get("ath"), ath))
    elif "ath" in claims:
        raise ValueError("ath on a token request")
    with lock:
        if claims["jti"] in seen_jti:
            raise ValueError("jti reused (first at %s)" % seen_jti[claims["jti"]])
        seen_jti[claims["jti"]] = where
    return claims, jkt


def registered_key(alg):
    """The public key registered for `alg`: a PEM text, or the path of a PEM file (a private key's public half)."""
    pem = S.get("client_keys", {}).get(alg)
    if pem is None:
        return None
    data = (pem if "-----BEGIN" in pem else open(pem).read()).encode()
    if b"PRIVATE KEY" in data:
        return serialization.load_pem_private_key(data, password=None).public_key()
    return serialization.load_pem_public_key(data)


def check_assertion(assertion, aud_expected, kind):
    header, claims, si, sig = parse_jws(assertion, kind)
    alg = header.get("alg")
    pub = registered_key(alg)
    if pub is None:
        raise ValueError("%s alg %r not registered" % (kind, alg))
    verify(alg, pub, si, sig)
    if "jwk" in header:
        raise ValueError("%s header carries a key" % kind)
    if S.get("expect_kid") is not None and header.get("kid") != S["expect_kid"]:
        raise ValueError("%s kid %r" % (kind, header.get("kid")))
    for name in ("iss", "sub", "jti"):
        if not isinstance(claims.get(name), str) or not claims[name]:
            raise ValueError("%s %s missing" % (kind, name))
    for name in ("exp", "iat"):
        if type(claims.get(name)) is not int:
            raise ValueError("%s %s %r not an integer" % (kind, name, claims.get(name)))
    aud = claims.get("aud")
    if not (aud == aud_expected or (isinstance(aud, list) and aud_expected in aud)):
        raise ValueError("%s aud %r != %r" % (kind, aud, aud_expected))
    now = time.time()
    if claims["exp"] <= now:
        raise ValueError("%s expired" % kind)
    if claims["exp"] - claims["iat"] > 300 or claims["iat"] > now + 5 or claims["iat"] < now - 60:
        raise ValueError("%s lifetime/iat %r" % (kind, claims))
    if "nbf" in claims and (type(claims["nbf"]) is not int or claims["nbf"] > now + 5):
        raise ValueError("%s nbf" % kind)
    with lock:
        key = "assertion:" + claims["jti"]
        if key in seen_jti:
            raise ValueError("%s jti reused" % kind)
        seen_jti[key] = kind
    return header, claims


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def dispatch(self, method):
        port = self.server.server_address[1]
        try:
            if port == PORTS["token"] and S.get("api_on_token_port") and self.path.startswith(S.get("api_base", "") + "/"):
                return self.api(method)
            if port == PORTS["token"]:
                return self.token(method)
            if port == PORTS["api"]:
                return self.api(method)
            return self.control(method)
        except Exception as e:  # noqa
            fail("%s %s: unexpected %r" % (method, self.path, e))
            self.reply(500, {"error": "probe"})

    def do_GET(self): self.dispatch("GET")
    def do_POST(self): self.dispatch("POST")
    def do_PUT(self): self.dispatch("PUT")
    def do_PATCH(self): self.dispatch("PATCH")
    def do_DELETE(self): self.dispatch("DELETE")

    def url(self, path):
        return "http://%s%s" % (self.headers.get("Host"), path.split("?")[0].split("#")[0])

    def token(self, method):
        body = self.body()
        form_list = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True)
        form = dict(form_list)
        rec = {"side": "token", "method": method, "path": self.path, "headers": dict(self.headers.items()), "form": form_list}
        with lock:
            log.append(rec)
            stats["token_requests"] += 1
        if len(form) != len(form_list):
            fail("token: repeated form field")
        if self.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
            fail("token: content-type %r" % self.headers.get("Content-Type"))
        token_url = self.url(self.path)
        jkt = None
        if S.get("dpop", True):
            try:
                nonce_needed = S.get("token_nonce", False)
                claims, jkt = check_proof(self.headers.get_all("DPoP") or [], "POST", token_url, where="token")
                if nonce_needed and claims.get("nonce") != nonce_state["token"]:
                    stats["token_nonce_challenges"] += 1
                    return self.reply(400, {"error": "use_dpop_nonce", "error_description": "nonce"}, [("DPoP-Nonce", nonce_state["token"])])
                if S.get("refuse_dpop_proof"):
                    return self.reply(400, {"error": "invalid_dpop_proof", "error_description": "proof refused by policy"})
            except (ValueError, InvalidSignature) as e:
                fail("token proof: %s" % (e or "bad signature"))
                return self.reply(400, {"error": "invalid_dpop_proof"})
        # client authentication
        auth = S.get("client_auth", "private_key_jwt")
        if auth == "private_key_jwt":
            if form.get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
                fail("client_assertion_type %r" % form.get("client_assertion_type"))
                return self.reply(401, {"error": "invalid_client"})
            if "client_secret" in form or self.headers.get("Authorization"):
                fail("secret or Authorization with private_key_jwt")
            try:
                _, claims = check_assertion(form.get("client_assertion", ""), S.get("aud", token_url), "client_assertion")
            except (ValueError, InvalidSignature) as e:
                if S.get("echo_on_reject"):
                    return self.reply(401, {"error": "invalid_client", "error_description": "bad " + body.decode()},
                                      [("WWW-Authenticate", 'Basic realm="' + form.get("client_assertion", "") + '"')])
                fail("client_assertion: %s" % (e or "bad signature"))
                return self.reply(401, {"error": "invalid_client"})
            if claims["iss"] != S["client_id"] or claims["sub"] != S["client_id"]:
                fail("client_assertion iss/sub %r/%r" % (claims["iss"], claims["sub"]))
            if "client_id" in form and form["client_id"] != S["client_id"]:
                fail("client_id mismatch")
        elif auth == "tls_client_auth":
            if form.get("client_id") != S["client_id"] or "client_secret" in form or "client_assertion" in form:
                fail("tls_client_auth form %r" % sorted(form))
        grant = form.get("grant_type")
        if grant == "refresh_token":
            rt = form.get("refresh_token")
            with lock:
                entry = refresh.get(rt)
                if entry is None or entry["family"] in revoked:
                    return self.reply(400, {"error": "invalid_grant"})
                if entry["used"]:
                    stats["reuse"] += 1
                    revoked.add(entry["family"])
                    fail("refresh token presented twice: %s" % rt)
                    return self.reply(400, {"error": "invalid_grant", "error_description": "reuse"})
                if entry["jkt"] is not None and entry["jkt"] != jkt:
                    fail("bound refresh token with another key")
                    return self.reply(400, {"error": "invalid_grant"})
                family = entry["family"]
                if not S.get("omit_refresh_on_refresh"):
                    entry["used"] = True
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            try:
                check_assertion(form.get("assertion", ""), S.get("aud", token_url), "assertion")
            except (ValueError, InvalidSignature) as e:
                fail("assertion: %s" % e)
                return self.reply(400, {"error": "invalid_grant"})
            family = None
        elif grant == "urn:ietf:params:oauth:grant-type:token-exchange":
            for k in ("subject_token", "subject_token_type"):
                if not form.get(k):
                    fail("token-exchange missing %s" % k)
            if form.get("subject_token_type") not in ("urn:ietf:params:oauth:token-type:jwt", "urn:ietf:params:oauth:token-type:access_token",
                                                       "urn:ietf:params:oauth:token-type:id_token"):
                fail("subject_token_type %r" % form.get("subject_token_type"))
            if ("actor_token" in form) != ("actor_token_type" in form):
                fail("actor_token without actor_token_type")
            family = None
        elif grant == "client_credentials":
            family = None
        else:
            fail("grant_type %r" % grant)
            return self.reply(400, {"error": "unsupported_grant_type"})
        at = "at-" + secrets.token_urlsafe(16)
        with lock:
            access[at] = {"jkt": jkt, "expires": time.time() + float(S.get("lifetime", 3600))}
            stats["granted"] += 1
        if S.get("token_delay"):
            time.sleep(float(S["token_delay"]))
        answer = {"access_token": at, "token_type": S.get("token_type", "DPoP"), "expires_in": S.get("expires_in", 3600)}
        if family is not None and not S.get("omit_refresh_on_refresh"):
            new = "rt-" + secrets.token_urlsafe(16)
            with lock:
                refresh[new] = {"used": False, "family": family, "jkt": jkt}
            answer["refresh_token"] = new
        answer.update(S.get("extra", {}))
        headers = []
        if S.get("token_nonce", False) and S.get("rotate_token_nonce"):
            nonce_state["token"] = secrets.token_urlsafe(12)
            headers.append(("DPoP-Nonce", nonce_state["token"]))
        self.reply(200, answer, headers)

    def api(self, method):
        body = self.body()
        path = self.path
        rec = {"side": "api", "method": method, "path": path, "headers": dict(self.headers.items()), "body": body.decode("latin-1")}
        with lock:
            log.append(rec)
        base = S.get("api_base", "")
        if not path.startswith(base + "/"):
            fail("api: path %r outside base %r" % (path, base))
        auths = self.headers.get_all("Authorization") or []
        if len(auths) != 1:
            fail("api: %d Authorization fields" % len(auths))
            return self.reply(401, {}, [("WWW-Authenticate", 'DPoP error="invalid_token"')])
        scheme, _, tok = auths[0].partition(" ")
        expected_scheme = "Bearer" if S.get("token_type", "DPoP").lower() == "bearer" else "DPoP"
        info = access.get(tok)
        if info is None or info["expires"] < time.time():
            stats["api_invalid"] += 1
            return self.reply(401, {}, [("WWW-Authenticate", S.get("invalid_challenge", 'DPoP algs="ES256 EdDSA", error="invalid_token"'))])
        if scheme != expected_scheme:
            fail("api: scheme %r" % scheme)
        if expected_scheme == "DPoP":
            try:
                claims, jkt = check_proof(self.headers.get_all("DPoP") or [], method, self.url(path), token=tok, where="api")
                if S.get("expect_htu_prefix") and not claims["htu"].startswith(S["expect_htu_prefix"]):
                    fail("api htu %r lacks %r" % (claims["htu"], S["expect_htu_prefix"]))
            except (ValueError, InvalidSignature) as e:
                fail("api proof: %s" % (e or "bad signature"))
                return self.reply(401, {}, [("WWW-Authenticate", 'DPoP error="invalid_dpop_proof"')])
            if jkt != info["jkt"]:
                fail("api: proof key is not the token's cnf.jkt")
            window = int(S.get("api_nonce_window", 0))
            accepted = [nonce_state["api"]] + (recent_api_nonces[-window:] if window > 0 else [])
            if S.get("api_nonce") and claims.get("nonce") not in accepted:
                stats["api_nonce_challenges"] += 1
                challenge = S.get("challenge", 'DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"')
                headers = [("WWW-Authenticate", c) for c in (challenge if isinstance(challenge, list) else [challenge])]
                return self.reply(401, {"error": "use_dpop_nonce"}, headers + [("DPoP-Nonce", nonce_state["api"])])
        elif self.headers.get("DPoP"):
            fail("api: DPoP field with a bearer token")
        with lock:
            stats["api_ok"] += 1
            headers = []
            if S.get("api_nonce_on_ok"):
                recent_api_nonces.append(nonce_state["api"])
                nonce_state["api"] = secrets.token_urlsafe(12)
                headers.append(("DPoP-Nonce", nonce_state["api"]))
        self.reply(200, {"ok": True, "path": path, "method": method}, headers)

    def control(self, method):
        self.body()
        if self.path == "/stats":
            with lock:
                return self.reply(200, dict(stats, failures=failures, log=log))
        if self.path == "/expire":
            with lock:
                for v in access.values():
                    v["expires"] = 0
            return self.reply(200, {})
        if self.path.startswith("/set/"):
            key, _, value = self.path[5:].partition("=")
            S[key] = json.loads(urllib.parse.unquote(value))
            return self.reply(200, {})
        if self.path.startswith("/nonce/"):
            side, _, value = self.path[7:].partition("=")
            nonce_state[side] = urllib.parse.unquote(value)
            return self.reply(200, {})
        self.reply(404, {})


servers = [ThreadingHTTPServer(("127.0.0.1", 0), H) for _ in range(3)]
PORTS = {"token": servers[0].server_address[1], "api": servers[1].server_address[1]}
for s in servers:
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
print(" ".join(str(s.server_address[1]) for s in servers), flush=True)
try:
    threading.Event().wait()
except KeyboardInterrupt:
    pass

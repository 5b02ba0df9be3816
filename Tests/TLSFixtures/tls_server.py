#!/usr/bin/env python3
"""HTTPS server for the TLS tests of HTTPTransport and tokenrelay (Python 3 standard library only).

Python's `ssl` module is a real TLS implementation independent of ours (client-certificate checks, SNI,
TLS 1.3 session tickets) without a TLS server of our own. Listens on 127.0.0.1, port 0 (the kernel
picks), and prints the port as the first line on stdout.

Every role answers with the server name the client sent and the common name of its client certificate,
and counts TLS connections and resumed sessions: GET /test/tls-stats answers
`{"connections": N, "resumed": M}` (a test can tell a resumed handshake from a full one).

--role upstream (HTTPTransport's tests): HTTP/1.1 with keep-alive; every answer carries X-Connection (a
number per TLS connection, so a test can tell reuse from reconnects), X-Resumed (1 when this connection's
TLS session was resumed), X-SNI and X-Client-CN. Paths:

* GET /big?N: N bytes of the pattern i % 251;
* GET /records?N: a 100-byte body in each of N TLS records after the head's (letters a, b, c, ... one per
  record), all of them leaving in one TCP segment (TCP_CORK while they are written): what a reader takes
  in one read(2) with read-ahead, and in two per record without;
* POST or PUT anything: the request body's length and a checksum (sum of bytes mod 2**32) as text;
* GET with `Upgrade: echo`: 101 Switching Protocols, then "early" in the same TLS record as the head,
  then every byte received is echoed until the client's close_notify, after which the server sends
  "bye" and closes (byte-tunnel tests);
* anything else: "ok".

--role api (tokenrelay's tests) plays both parts tokenrelay talks to:

* the API: any request except the token endpoint answers 200 with a JSON echo (method, path, whether an
  Authorization header was present and whether it carried the current access token, the SNI name, the
  client certificate's subject CN, whether the TLS session was resumed). A request with a stale token
  gets 401, as a real API would;
* the token endpoint: POST /oauth/token with grant_type=refresh_token and the current refresh token
  rotates both tokens (a presented burnt token gets 400 invalid_grant).

  For `tokenrelay login` over HTTPS, POST /device/code starts a device authorization (RFC 8628 §3.2) and
  POST /oauth/token with the device_code grant answers with tokens at once (the user "approved" already).

  POST /test/expire invalidates the current access token (the refresh token stays valid), so a test can
  make tokenrelay refresh. Every response to a request line carrying "close" in its path closes the
  connection, so a test can make tokenrelay reconnect.

Options: --cert/--key (server certificate), --client-ca (require a client certificate signed by it),
--tls12-only (a refused client certificate then fails inside the handshake), --access/--refresh (the
api role's initial tokens).
"""
import argparse
import json
import socket
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Tokens:
    def __init__(self, access, refresh):
        self.lock = threading.Lock()
        self.access = access
        self.refresh = refresh
        self.refreshes = 0
        self.expiries = 0

    def rotate(self, presented):
        with self.lock:
            if presented != self.refresh:
                return None
            self.refreshes += 1
            self.access = "tls-access-%d" % self.refreshes
            self.refresh = "tls-refresh-%d" % self.refreshes
            return {"access_token": self.access, "refresh_token": self.refresh,
                    "token_type": "Bearer", "expires_in": 3600}

    def expire_access(self):
        with self.lock:
            self.expiries += 1
            self.access = "expired-%d" % self.expiries


class TLSHandler(BaseHTTPRequestHandler):
    """What both roles share: logging, the connection's TLS facts, the statistics path."""
    protocol_version = "HTTP/1.1"
    server_version = "tls-test-server"
    # The api role closes after any answer to a path containing "close" (a test makes tokenrelay reconnect).
    closes_on_close_path = False

    def setup(self):
        super().setup()
        self.number, self.resumed = self.server.count_connection(self.connection)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s\n" % (fmt % args))

    def sni(self):
        return getattr(self.connection, "sni_name", None)

    def peer_cn(self):
        cert = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") else None
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return value
        return None

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_body(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.closes_on_close_path and "close" in self.path:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def send_tls_stats(self):
        self.read_body()
        connections, resumed = self.server.stats()
        self.send_body(200, json.dumps({"connections": connections, "resumed": resumed}).encode(),
                       [("Content-Type", "application/json")])


class UpstreamHandler(TLSHandler):
    def _reply(self, body):
        self.send_body(200, body, [("X-Connection", str(self.number)), ("X-Resumed", "1" if self.resumed else "0"),
                                   ("X-SNI", self.sni() or "-"), ("X-Client-CN", self.peer_cn() or "-")])

    def _tunnel(self):
        self.send_response_only(101, "Switching Protocols")
        self.send_header("Upgrade", "echo")
        self.send_header("Connection", "Upgrade")
        self._headers_buffer.append(b"\r\nearly")
        self.flush_headers()
        while True:
            data = self.connection.recv(65536)
            if not data:
                break
            self.connection.sendall(data)
        self.connection.sendall(b"bye")
        self.close_connection = True

    def do_GET(self):
        if self.path == "/test/tls-stats":
            self.send_tls_stats()
        elif (self.headers.get("Upgrade") or "").lower() == "echo":
            self._tunnel()
        elif self.path.startswith("/records?"):
            n = int(self.path[9:])
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            self.send_response(200)
            self.send_header("Content-Length", str(100 * n))
            self.end_headers()   # the head: one record
            for i in range(n):
                self.connection.sendall(bytes([97 + i % 26]) * 100)   # one record each
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        elif self.path.startswith("/big?"):
            n = int(self.path[5:])
            pattern = bytes(i % 251 for i in range(251 * 64))
            body = (pattern * (n // len(pattern) + 1))[:n]
            self._reply(body)
        else:
            self._reply(b"ok")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        total = 0
        checksum = 0
        while total < length:
            chunk = self.rfile.read(min(65536, length - total))
            if not chunk:
                break
            total += len(chunk)
            checksum = (checksum + sum(chunk)) % (2 ** 32)
        self._reply(("%d %d" % (total, checksum)).encode())

    do_PUT = do_POST


class APIHandler(TLSHandler):
    closes_on_close_path = True

    def _reply(self, status, payload):
        self.send_body(status, json.dumps(payload).encode(), [("Content-Type", "application/json")])

    def _api(self):
        if self.path == "/test/tls-stats":
            self.send_tls_stats()
            return
        self.read_body()
        tokens = self.server.tokens
        auth = self.headers.get("Authorization")
        with tokens.lock:
            current = auth == "Bearer " + tokens.access
        payload = {"method": self.command, "path": self.path, "authorization_present": auth is not None,
                   "token_current": current, "sni": self.sni(), "client_cn": self.peer_cn(),
                   "tls_resumed": self.resumed}
        self._reply(200 if current else 401, payload)

    def do_POST(self):
        if self.path == "/oauth/token":
            form = urllib.parse.parse_qs(self.read_body().decode())
            granted = None
            if form.get("grant_type") == ["refresh_token"]:
                granted = self.server.tokens.rotate((form.get("refresh_token") or [""])[0])
            elif form.get("grant_type") == ["urn:ietf:params:oauth:grant-type:device_code"] and form.get("device_code") == ["tls-device-code"]:
                granted = {"access_token": "tls-login-access", "refresh_token": "tls-login-refresh",
                           "token_type": "Bearer", "expires_in": 3600}
            if granted is None:
                self._reply(400, {"error": "invalid_grant"})
            else:
                self._reply(200, granted)
        elif self.path == "/device/code":
            self.read_body()
            self._reply(200, {"device_code": "tls-device-code", "user_code": "TLS-CODE", "interval": 1, "expires_in": 600,
                              "verification_uri": "https://localhost/activate"})
        elif self.path == "/test/expire":
            self.read_body()
            self.server.tokens.expire_access()
            self._reply(200, {"expired": True})
        else:
            self._api()

    do_GET = do_PUT = do_DELETE = do_PATCH = _api


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, context, handler, tokens):
        super().__init__(("127.0.0.1", 0), handler)
        self.context = context
        self.tokens = tokens
        self.counts_lock = threading.Lock()
        self.connections = 0
        self.resumed = 0

    def count_connection(self, connection):
        resumed = bool(getattr(connection, "session_reused", False))
        with self.counts_lock:
            self.connections += 1
            self.resumed += 1 if resumed else 0
            return self.connections, resumed

    def stats(self):
        with self.counts_lock:
            return self.connections, self.resumed

    def finish_request(self, request, client_address):
        # The handshake runs in the connection's own thread, so a client that never finishes it (or fails
        # it) blocks neither accept() nor other connections.
        try:
            request.settimeout(10)
            tls = self.context.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as error:
            sys.stderr.write("handshake failed: %s\n" % error)
            # With TLS 1.3 the client has finished its side and sent its request by now. Closing with that
            # request unread would be a reset, which can overtake our alert: end our side, drain, then close.
            try:
                request.settimeout(2)
                request.shutdown(socket.SHUT_WR)
                while request.recv(65536):
                    pass
            except OSError:
                pass
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            try:
                tls.close()
            except OSError:
                pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["upstream", "api"], required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca")
    parser.add_argument("--tls12-only", action="store_true")
    parser.add_argument("--access", default="initial-access")
    parser.add_argument("--refresh", default="initial-refresh")
    args = parser.parse_args()

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    if args.tls12_only:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if args.client_ca:
        context.load_verify_locations(args.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED

    def remember_sni(sock, name, _context):
        sock.sni_name = name

    context.sni_callback = remember_sni
    handler = UpstreamHandler if args.role == "upstream" else APIHandler
    server = TLSServer(context, handler, Tokens(args.access, args.refresh))
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

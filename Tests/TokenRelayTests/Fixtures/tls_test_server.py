#!/usr/bin/env python3
"""HTTPS server for tokenrelay's TLS tests (Python 3 standard library only).

Listens on 127.0.0.1, port 0 (the kernel picks), and prints the port as the first line on stdout.
It plays both parts tokenrelay talks to:

* the API: any request except the token endpoint answers 200 with a JSON echo (method, path, whether an
  Authorization header was present and whether it carried the current access token, the SNI name, the
  client certificate's subject CN). A request with a stale token gets 401, as a real API would;
* the token endpoint: POST /oauth/token with grant_type=refresh_token and the current refresh token
  rotates both tokens (a presented burnt token gets 400 invalid_grant).

For `tokenrelay login` over HTTPS, POST /device/code starts a device authorization (RFC 8628 §3.2) and
POST /oauth/token with the device_code grant answers with tokens at once (the user "approved" already).

POST /test/expire invalidates the current access token (the refresh token stays valid), so a test can
make tokenrelay refresh. Every response to a request line carrying "close" in its path closes the
connection, so a test can make tokenrelay reconnect.

Options: --cert/--key (server certificate), --client-ca (require a client certificate signed by it),
--access/--refresh (the initial tokens).
"""
import argparse
import socket
import json
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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tls-test-server"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s\n" % (fmt % args))

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if "close" in self.path:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _peer_cn(self):
        cert = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") else None
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return value
        return None

    def _api(self):
        self._body()
        tokens = self.server.tokens
        auth = self.headers.get("Authorization")
        with tokens.lock:
            current = auth == "Bearer " + tokens.access
        payload = {"method": self.command, "path": self.path, "authorization_present": auth is not None,
                   "token_current": current, "sni": getattr(self.connection, "sni_name", None),
                   "client_cn": self._peer_cn()}
        self._reply(200 if current else 401, payload)

    def do_POST(self):
        if self.path == "/oauth/token":
            form = urllib.parse.parse_qs(self._body().decode())
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
            self._body()
            self._reply(200, {"device_code": "tls-device-code", "user_code": "TLS-CODE", "interval": 1, "expires_in": 600,
                              "verification_uri": "https://localhost/activate"})
        elif self.path == "/test/expire":
            self._body()
            self.server.tokens.expire_access()
            self._reply(200, {"expired": True})
        else:
            self._api()

    do_GET = do_PUT = do_DELETE = do_PATCH = _api


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, context, tokens):
        super().__init__(("127.0.0.1", 0), Handler)
        self.context = context
        self.tokens = tokens

    def finish_request(self, request, client_address):
        # The handshake runs in the connection's own thread, so a failing client never blocks accept().
        try:
            tls = self.context.wrap_socket(request, server_side=True)
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
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca")
    parser.add_argument("--access", default="initial-access")
    parser.add_argument("--refresh", default="initial-refresh")
    parser.add_argument("--tls12-only", action="store_true")
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

    server = TLSServer(context, Tokens(args.access, args.refresh))
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""HTTPS upstream for HTTPTransport's TLS tests (Python 3 standard library only).

Listens on 127.0.0.1, port 0 (the kernel picks), and prints the port as the first line on stdout.
HTTP/1.1 with keep-alive. Every answer carries X-Connection (a number per TLS connection, so a test can
tell reuse from reconnects), X-SNI (the server name the client sent) and X-Client-CN (the common name of
the client certificate, if any). Paths:

* GET /big?N: N bytes of the pattern i % 251;
* POST or PUT anything: the request body's length and a checksum (sum of bytes mod 2**32) as text;
* GET with `Upgrade: echo`: 101 Switching Protocols, then "early" in the same TLS record as the head,
  then every byte received is echoed until the client's close_notify, after which the server sends
  "bye" and closes (byte-tunnel tests);
* anything else: "ok".

Options: --cert/--key (server certificate), --client-ca (require a client certificate signed by it),
--tls12-only (a refused client certificate then fails inside the handshake).
"""
import argparse
import itertools
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

connection_numbers = itertools.count(1)
numbers_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        with numbers_lock:
            self.number = next(connection_numbers)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s\n" % (fmt % args))

    def _reply(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Connection", str(self.number))
        self.send_header("X-SNI", getattr(self.connection, "sni_name", None) or "-")
        cn = "-"
        cert = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") else None
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        self.send_header("X-Client-CN", cn)
        self.end_headers()
        self.wfile.write(body)

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
        if (self.headers.get("Upgrade") or "").lower() == "echo":
            self._tunnel()
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


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, context):
        super().__init__(("127.0.0.1", 0), Handler)
        self.context = context

    def finish_request(self, request, client_address):
        # The handshake runs in the connection's own thread, so a client that never finishes it blocks nothing.
        try:
            request.settimeout(10)
            tls = self.context.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as error:
            sys.stderr.write("handshake failed: %s\n" % error)
            try:
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
    server = TLSServer(context)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

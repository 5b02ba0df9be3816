#!/usr/bin/env python3
"""A gRPC API for tokenrelay's gRPC refresh tests, served by Python's grpcio (h2c, insecure) on 127.0.0.1.

Every call must carry `authorization: Bearer <token>`; the token is checked against the token server's
introspection URL (`GET <introspect_url>?token=T`: 204 valid, anything else not). A refused call ends with
gRPC status 16 (UNAUTHENTICATED) before any response message, which grpcio sends as a Trailers-Only response.
Messages are raw bytes (no protobuf): the methods of service `test.Api` are

  /test.Api/Unary          request bytes -> JSON {"echo": <request as text>, "connections": <distinct peers so far>}
  /test.Api/Late           as Unary, but the response head goes before the token is checked: a refusal is
                           then HEADERS and trailers with no DATA (not Trailers-Only)
  /test.Api/Refuse         unary: UNAUTHENTICATED ("refused whatever the token") before any message, every time
  /test.Api/Collect        client streaming: the request messages -> JSON {"messages": n, "bytes": total}
  /test.Api/Watch          server streaming: one message b"first", then UNAUTHENTICATED ("token revoked
                           mid-stream"), whatever the token: the status a client gets after a message
  /test.Api/Slow           server streaming: the response head at once, then after the delay in
                           milliseconds the request gives (at most 30000) the first message b"first"
                           (a watch with nothing to report yet), then b"second", then OK

Settings (JSON file, argv[1]):
  introspect_url           the token server's introspection endpoint
  max_connection_age_ms    optional: grpcio's grpc.max_connection_age_ms: each connection is ended with
                           GOAWAY at that age (grace 30 s for the streams in flight)

Prints "GRPC_PORT CONTROL_PORT" as the first stdout line. The control port (plain HTTP/1.1) answers
GET /stats: {"calls": {method: n}, "ok": {method: n}, "unauthenticated": {method: n}, "connections": n}.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc


class Api:
    def __init__(self, introspect_url):
        self.introspect_url = introspect_url
        self.lock = threading.Lock()
        self.stats = {"calls": {}, "ok": {}, "unauthenticated": {}}
        self.peers = set()

    def count(self, kind, method):
        with self.lock:
            table = self.stats[kind]
            table[method] = table.get(method, 0) + 1

    def token_is_valid(self, context):
        token = ""
        for key, value in context.invocation_metadata():
            if key == "authorization" and value.lower().startswith("bearer "):
                token = value[7:]
        if not token:
            return False
        url = self.introspect_url + "?" + urllib.parse.urlencode({"token": token})
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status == 204
        except urllib.error.HTTPError:
            return False

    def admit(self, method, context):
        """Counts the call and its connection; refuses it (UNAUTHENTICATED, no message) without a valid token."""
        self.count("calls", method)
        with self.lock:
            self.peers.add(context.peer())
        if not self.token_is_valid(context):
            self.count("unauthenticated", method)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or expired access token")

    def unary(self, request, context):
        self.admit("Unary", context)
        self.count("ok", "Unary")
        with self.lock:
            connections = len(self.peers)
        return json.dumps({"echo": request.decode("utf-8", "replace"), "connections": connections}).encode()

    def late(self, request, context):
        context.send_initial_metadata((("x-head", "early"),))
        self.admit("Late", context)
        self.count("ok", "Late")
        return json.dumps({"echo": request.decode("utf-8", "replace")}).encode()

    def refuse(self, request, context):
        self.count("calls", "Refuse")
        self.count("unauthenticated", "Refuse")
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "refused whatever the token")

    def collect(self, requests, context):
        self.admit("Collect", context)
        count = total = 0
        for message in requests:
            count += 1
            total += len(message)
        self.count("ok", "Collect")
        return json.dumps({"messages": count, "bytes": total}).encode()

    def watch(self, request, context):
        self.admit("Watch", context)
        yield b"first"
        self.count("unauthenticated", "Watch")
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "token revoked mid-stream")

    def slow(self, request, context):
        self.admit("Slow", context)
        # The response head now (grpcio would send it with the first message): the call is under way.
        context.send_initial_metadata((("x-watch", "started"),))
        time.sleep(min(max(int(request or b"0"), 0), 30000) / 1000)
        yield b"first"
        yield b"second"
        self.count("ok", "Slow")

    def snapshot(self):
        with self.lock:
            return dict(self.stats, connections=len(self.peers))


def main():
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    api = Api(settings["introspect_url"])
    options = []
    if settings.get("max_connection_age_ms"):
        options += [("grpc.max_connection_age_ms", int(settings["max_connection_age_ms"])),
                    ("grpc.max_connection_age_grace_ms", 30000)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=options)
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(api.unary),
        "Late": grpc.unary_unary_rpc_method_handler(api.late),
        "Refuse": grpc.unary_unary_rpc_method_handler(api.refuse),
        "Collect": grpc.stream_unary_rpc_method_handler(api.collect),
        "Watch": grpc.unary_stream_rpc_method_handler(api.watch),
        "Slow": grpc.unary_stream_rpc_method_handler(api.slow),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Api", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    class Control(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps(api.snapshot()).encode() if self.path == "/stats" else b"{}"
            self.send_response(200 if self.path == "/stats" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    control = ThreadingHTTPServer(("127.0.0.1", 0), Control)
    control.daemon_threads = True
    print(port, control.server_address[1], flush=True)
    control.serve_forever()


if __name__ == "__main__":
    main()

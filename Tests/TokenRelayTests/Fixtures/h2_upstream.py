"""An HTTP/2 upstream (h2c with prior knowledge, or h2 over TLS when settings name a cert_file and key_file,
offering h2 in ALPN) for tokenrelay's upstream.http2 tests. Usage: h2_upstream.py SETTINGS.json

Settings (all optional):
  max_concurrent_streams  announced in SETTINGS (default 100)
  goaway_after            on the FIRST connection only: once this many requests arrived, GOAWAY with the last of
                          them as last-stream-id; later streams are never answered (the client must retry them)
  reject_tokens_file      a file of access tokens (one a line, read per request) answered 401 / grpc-status 16
  delay_ms                each answer waits this long on the server (so that streams overlap)
  events_file             one JSON line per event: {"event": "connection", "conn": n} and
                          {"event": "request", "conn": n, "stream": id, "headers": [[name, value], ...], "body": len}
  stall_paths             requests to these paths get a head and 10 of 100 body bytes, then silence
  reset_paths             requests to these paths are answered with RST_STREAM INTERNAL_ERROR
  invalid_field_paths     requests to these paths are answered with a `connection` field (invalid in HTTP/2)
  hpack_bomb_paths        requests to these paths are answered with a header block that decodes into 40 MB
  broken_frame_paths      requests to these paths are answered with a CONTINUATION flood (the connection stays open 3 s)
  large_paths             {path: bytes}: a 200 of that many body bytes, sent as the client's window allows; when a
                          window stops it, {"event": "window_closed", "stream": id, "sent": n} is logged
  many_fields_paths       requests to these paths get a 200 with 256 fields (x-f0 ... x-f255) and no body
  cert_file, key_file     serve TLS with ALPN ["h2"] (or ["http/1.1"] with alpn_http11_only: answers 505 over HTTP/1.1)
  alpn_file               with TLS: a file read at each new connection, "h2" or "http/1.1" (a redeploy that changes what
                          the server selects); an open h2 connection that sees "http/1.1" at a request sends GOAWAY below
                          it and closes (the request not processed)

A request with `expect: 100-continue` gets a 100 at once, or, with a rejected token, its 401 at once (before
any body; logged {"event": "refused_before_body", "stream": id}); with ignore_expect, no 100 is sent.
Answers: a request with content-type application/grpc gets a gRPC answer (its message echoed, grpc-status 0,
or Trailers-Only grpc-status 16 for a rejected token); anything else 200 "ok <path>", or 401 for a rejected token.
Prints its port on the first stdout line; stops on SIGTERM."""
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time

try:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings
    from hyperframe.frame import GoAwayFrame
except ImportError:
    # Debian's python3-h2 is for the system's python3, which may not be the first on PATH.
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

settings = json.load(open(sys.argv[1]))
lock = threading.Lock()
connections = [0]
contexts = {}


def log(event):
    path = settings.get("events_file")
    if not path:
        return
    with lock:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


def rejected(token):
    path = settings.get("reject_tokens_file")
    if not path or not os.path.exists(path):
        return False
    return token in [line.strip() for line in open(path) if line.strip()]


class Connection:
    def __init__(self, sock, number):
        self.sock = sock
        self.number = number
        self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        # In the first SETTINGS frame: the client must know the limit before it opens streams.
        self.conn.local_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: settings.get("max_concurrent_streams", 100)})
        self.unanswered = set()
        self.streams = {}
        self.received = 0
        self.goaway_last = None
        self.send_lock = threading.Lock()
        self.linger_after_eof = False
        self.large = {}   # stream id -> body bytes still to send (large_paths), sent as windows open
        self.blocked = set()

    def send(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def run(self):
        self.conn.initiate_connection()
        with self.send_lock:
            self.send()
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                if self.linger_after_eof:
                    # A server that does not close when the client has: the client's own close must not wait for it.
                    time.sleep(3)
                return
            with self.send_lock:
                try:
                    events = self.conn.receive_data(data)
                except Exception:
                    return
                for event in events:
                    self.handle(event)
                self.send_large()
                self.send()

    def handle(self, event):
        if isinstance(event, h2.events.RequestReceived) and alpn_mode() == "http/1.1":
            # Redeployed as HTTP/1.1-only: this connection goes, the request unprocessed.
            self.conn.close_connection(error_code=0, last_stream_id=max(0, event.stream_id - 2))
            self.send()
            self.sock.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(event, h2.events.RequestReceived) and dict(event.headers).get("expect") == "100-continue":
            token = dict(event.headers).get("authorization", "").removeprefix("Bearer ")
            if rejected(token):
                log({"event": "refused_before_body", "conn": self.number, "stream": event.stream_id})
                body = b'{"error":"invalid_token"}'
                self.conn.send_headers(event.stream_id, [(":status", "401"), ("www-authenticate", 'Bearer error="invalid_token"'),
                                                         ("content-length", str(len(body)))])
                self.conn.send_data(event.stream_id, body, end_stream=True)
                return
            if not settings.get("ignore_expect"):
                self.conn.send_headers(event.stream_id, [(":status", "100")])
        if isinstance(event, h2.events.RequestReceived):
            self.streams[event.stream_id] = {"headers": [list(h) for h in event.headers], "body": b""}
            self.received += 1
            limit = settings.get("goaway_after")
            if limit and self.number == 1 and self.goaway_last is None and self.received >= limit:
                # A graceful GOAWAY written by hand (h2's close_connection would stop answering the streams
                # below it too): the streams up to here are still answered, later ones never.
                self.goaway_last = event.stream_id
                frame = GoAwayFrame(0)
                frame.last_stream_id = event.stream_id
                frame.error_code = 0
                self.send()
                self.sock.sendall(frame.serialize())
        elif isinstance(event, h2.events.TrailersReceived):
            if event.stream_id in self.streams:
                self.streams[event.stream_id]["trailers"] = [list(h) for h in event.headers]
        elif isinstance(event, h2.events.DataReceived):
            if event.stream_id in self.streams:
                self.streams[event.stream_id]["body"] += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and dict(self.streams.get(event.stream_id, {}).get("headers", [])).get(":path") in settings.get("reset_paths", []):
            self.conn.reset_stream(event.stream_id, error_code=2)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is None or (self.goaway_last is not None and event.stream_id > self.goaway_last):
                return
            self.unanswered.add(event.stream_id)
            log({"event": "request", "conn": self.number, "stream": event.stream_id, "headers": stream["headers"], "body": len(stream["body"]),
                 "trailers": stream.get("trailers", [])})
            delay = settings.get("delay_ms", 0)
            if delay:
                threading.Thread(target=self.answer_later, args=(event.stream_id, stream, delay / 1000.0), daemon=True).start()
            else:
                self.answer(event.stream_id, stream)

    def answer_later(self, stream_id, stream, delay):
        time.sleep(delay)
        with self.send_lock:
            try:
                self.answer(stream_id, stream)
                self.send()
            except Exception:
                pass

    def answer(self, stream_id, stream):
        self.respond(stream_id, stream)
        self.unanswered.discard(stream_id)
        if self.goaway_last is not None and not self.unanswered:
            # Everything the GOAWAY promised is answered: the connection ends.
            self.send()
            self.sock.shutdown(socket.SHUT_RDWR)

    def respond(self, stream_id, stream):
        headers = dict(stream["headers"])
        token = headers.get("authorization", "").removeprefix("Bearer ")
        path = headers.get(":path", "")
        if headers.get("content-type", "").startswith("application/grpc"):
            if rejected(token):
                self.conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc"),
                                                   ("grpc-status", "16"), ("grpc-message", "token expired")], end_stream=True)
                return
            self.conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
            self.conn.send_data(stream_id, stream["body"])
            self.conn.send_headers(stream_id, [("grpc-status", "0"), ("x-trailer", "seen")], end_stream=True)
            return
        if path in settings.get("large_paths", {}):
            self.conn.send_headers(stream_id, [(":status", "200"), ("content-length", str(settings["large_paths"][path]))])
            self.large[stream_id] = [settings["large_paths"][path], 0]
            self.send_large()
            return
        if path in settings.get("many_fields_paths", []):
            self.conn.send_headers(stream_id, [(":status", "200")] + [("x-f%d" % i, "1") for i in range(256)], end_stream=True)
            return
        if path in settings.get("stall_paths", []):
            # Half a body, then silence (the connection stays open).
            self.conn.send_headers(stream_id, [(":status", "200"), ("content-length", "100")])
            self.conn.send_data(stream_id, b"x" * 10)
            return
        if path in settings.get("hpack_bomb_paths", []):
            # 10,000 references to one 4,000-byte table entry: a 14 KB header block that decodes into 40 MB.
            self.conn.send_headers(stream_id, [(":status", "200")] + [("x-bomb", "v" * 4000)] * 10000, end_stream=True)
            return
        if path in settings.get("broken_frame_paths", []):
            # A header block in more CONTINUATION frames than tokenrelay allows (a connection error for the
            # client), and the connection kept open 3 s after the client's FIN.
            self.linger_after_eof = True
            self.send()
            sid = stream_id.to_bytes(4, "big")
            self.sock.sendall(b"\x00\x00\x00\x01\x00" + sid + b"".join(b"\x00\x00\x00\x09\x00" + sid for _ in range(20)))
            return
        if path in settings.get("invalid_field_paths", []):
            # A connection-specific field, which RFC 9113 forbids: h2 would refuse or strip it, so that is off.
            self.conn.config.validate_outbound_headers = self.conn.config.normalize_outbound_headers = False
            self.conn.send_headers(stream_id, [(":status", "200"), ("connection", "close"), ("content-length", "2")])
            self.conn.config.validate_outbound_headers = self.conn.config.normalize_outbound_headers = True
            self.conn.send_data(stream_id, b"ok", end_stream=True)
            return
        if rejected(token):
            body = b'{"error":"invalid_token"}'
            self.conn.send_headers(stream_id, [(":status", "401"), ("www-authenticate", 'Bearer error="invalid_token"'),
                                               ("content-length", str(len(body)))])
            self.conn.send_data(stream_id, body, end_stream=True)
            return
        body = ("ok %s %d\n" % (path, len(stream["body"]))).encode()
        self.conn.send_headers(stream_id, [(":status", "200"), ("content-type", "text/plain"), ("content-length", str(len(body)))])
        self.conn.send_data(stream_id, body, end_stream=True)


    def send_large(self):
        for stream_id, state in list(self.large.items()):
            try:
                while state[0] > 0:
                    room = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size, state[0])
                    if room <= 0:
                        if stream_id not in self.blocked:
                            self.blocked.add(stream_id)
                            log({"event": "window_closed", "conn": self.number, "stream": stream_id, "sent": state[1]})
                        break
                    self.blocked.discard(stream_id)
                    state[0] -= room
                    state[1] += room
                    self.conn.send_data(stream_id, b"x" * room, end_stream=state[0] == 0)
                if state[0] == 0:
                    del self.large[stream_id]
            except Exception:
                del self.large[stream_id]


def alpn_mode():
    path = settings.get("alpn_file")
    if not path:
        return None
    return open(path).read().strip()


def serve(sock, number, context):
    try:
        if context and alpn_mode():
            context = contexts[alpn_mode()]
        if context:
            sock = context.wrap_socket(sock, server_side=True)
            if sock.selected_alpn_protocol() != "h2":
                sock.recv(65536)
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nhttp/1.1\n")
                return
        Connection(sock, number).run()
    except Exception:
        pass
    finally:
        sock.close()


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    context = None
    if settings.get("cert_file"):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(settings["cert_file"], settings["key_file"])
        context.set_alpn_protocols(["http/1.1"] if settings.get("alpn_http11_only") else ["h2", "http/1.1"])
        for mode, protocols in (("h2", ["h2", "http/1.1"]), ("http/1.1", ["http/1.1"])):
            contexts[mode] = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            contexts[mode].load_cert_chain(settings["cert_file"], settings["key_file"])
            contexts[mode].set_alpn_protocols(protocols)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print(listener.getsockname()[1], flush=True)
    while True:
        sock, _ = listener.accept()
        with lock:
            connections[0] += 1
            number = connections[0]
        log({"event": "connection", "conn": number})
        threading.Thread(target=serve, args=(sock, number, context), daemon=True).start()


main()

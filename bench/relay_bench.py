"""What held_burst.py and fleet_burst.py share: a minimal asyncio HTTP/1.1 server side (the upstream and the
token endpoint answer through it), clients that send one request per connection, and starting, finding and
stopping tokenrelay processes."""
import asyncio
import json
import signal
import subprocess
import time


async def read_request(reader):
    """(request line, lower-cased headers, body) of the next request on the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return lines[0], headers, body


def serve(answer):
    """An asyncio.start_server handler: each request on a connection is answered with `await answer(request)`
    (the response's bytes) until the client closes."""
    async def handle(reader, writer):
        try:
            while True:
                writer.write(await answer(await read_request(reader)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
    return handle


def json_response(status, payload):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status.encode(), len(body), body)


def upstream_answer(headers, valid_access):
    """The upstream's answer: 200 for the one valid access token, else 401 as an API says it."""
    if headers.get("authorization") == "Bearer " + valid_access:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    return b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 0\r\n\r\n"


def tokens_response(access, refresh):
    return json_response("200 OK", {"access_token": access, "refresh_token": refresh, "expires_in": 3600, "token_type": "Bearer"})


async def connect(port):
    return await asyncio.open_connection("127.0.0.1", port)


async def one_request(connection, path, go=None):
    """GET `path` on an open connection (after `go` is set, if given), then close it; (status, monotonic time
    the response ended)."""
    reader, writer = connection
    try:
        if go is not None:
            await go.wait()
        writer.write(("GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n" % path).encode())
        await writer.drain()
        status = int((await reader.readline()).split(b" ")[1])
        await reader.read()
        return status, time.monotonic()
    finally:
        writer.close()


async def http_get(port, path, host="bench"):
    """The whole response to one GET on a new connection, as bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
    data = await reader.read()
    writer.close()
    return data


async def admin_json(port, path):
    return json.loads((await http_get(port, path, "admin")).split(b"\r\n\r\n", 1)[1])


def relay_config(api_port, token_port, tokens, count):
    """A relay on ephemeral ports in front of the upstream, refreshing at the token endpoint on demand only."""
    return {
        "listen": "127.0.0.1:0", "admin": {"listen": "127.0.0.1:0"},
        "upstream": {"url": "http://127.0.0.1:%d" % api_port},
        "tokens": tokens,
        "refresh": {"grant": "refresh_token", "token_url": "http://127.0.0.1:%d/token" % token_port,
                    "client_id": "bench", "client_auth": "none", "proactive": False},
        "limits": {"max_held_requests": max(1024, count * 2)},
        "log": {"level": "info"},
    }


async def start_relay(binary, config_file, log_path):
    """Starts `tokenrelay run` logging to `log_path`; (process, proxy port, admin port) once it listens."""
    log = open(log_path, "w+")
    process = subprocess.Popen([binary, "run", "--config", config_file], stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        log.seek(0)
        for line in log.read().splitlines():
            if "msg=listening" in line:
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                return process, int(fields["proxy"].rsplit(":", 1)[1]), int(fields["admin"].rsplit(":", 1)[1])
    stop_relays([process])
    raise SystemExit("tokenrelay did not start (log: %s)" % log_path)


def stop_relays(processes):
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

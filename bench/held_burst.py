#!/usr/bin/env python3
"""How fast a refresh releases a burst of held requests, beside a plain burst of the same size.

One run, all on 127.0.0.1:
  1. N clients send at once while the access token is dead: the upstream answers 401, tokenrelay holds
     every request and starts one refresh, which this script's token endpoint keeps waiting until all N
     are held (`/status` held_requests).
  2. The token endpoint answers. Measured: from its answer leaving to the last held request's response
     arriving ("replay").
  3. N clients send at once with a valid token ("plain"): the upstream's and the proxy's own time for N
     requests at that concurrency.
The figure that matters is replay - plain: what releasing a hold costs beyond forwarding itself
(issue goal: within 20 ms for 1000). Clients, upstream and token endpoint are asyncio in this one
process, so absolute times include Python; the difference mostly cancels it.

Usage: bench/held_burst.py [--count 1000] [--binary .build/release/tokenrelay] [--rounds 3]
"""
import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

VALID = "fresh-access"


async def read_request(reader):
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


async def upstream(reader, writer):
    try:
        while True:
            _, headers, _ = await read_request(reader)
            if headers.get("authorization") == "Bearer " + VALID:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            else:
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\n"
                             b"Content-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class TokenEndpoint:
    def __init__(self):
        self.release = asyncio.Event()
        self.answered_at = None
        self.calls = 0

    async def handle(self, reader, writer):
        try:
            while True:
                await read_request(reader)
                self.calls += 1
                await self.release.wait()
                body = json.dumps({"access_token": VALID, "refresh_token": "r-%d" % self.calls,
                                   "expires_in": 3600, "token_type": "Bearer"}).encode()
                self.answered_at = time.monotonic()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


async def connect(port):
    return await asyncio.open_connection("127.0.0.1", port)


async def one_request(connection, path, go=None):
    reader, writer = connection
    try:
        if go is not None:
            await go.wait()
        writer.write(("GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n" % path).encode())
        await writer.drain()
        status = (await reader.readline()).split(b" ")[1]
        await reader.read()
        return int(status), time.monotonic()
    finally:
        writer.close()


async def admin_json(port, path):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("GET %s HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n" % path).encode())
    data = await reader.read()
    writer.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


async def round_trip(args, workdir):
    tokens = TokenEndpoint()
    api = await asyncio.start_server(upstream, "127.0.0.1", 0, backlog=4096)
    token_server = await asyncio.start_server(tokens.handle, "127.0.0.1", 0)
    api_port = api.sockets[0].getsockname()[1]
    token_port = token_server.sockets[0].getsockname()[1]
    token_file = os.path.join(workdir, "tokens.json")
    with open(token_file, "w") as f:
        json.dump({"access_token": "dead-access", "refresh_token": "r-0"}, f)
    os.chmod(token_file, 0o600)
    config = {
        "listen": "127.0.0.1:0", "admin": {"listen": "127.0.0.1:0"},
        "upstream": {"url": "http://127.0.0.1:%d" % api_port},
        "tokens": {"file": token_file},
        "refresh": {"grant": "refresh_token", "token_url": "http://127.0.0.1:%d/token" % token_port,
                    "client_id": "bench", "client_auth": "none", "proactive": False},
        "limits": {"max_held_requests": max(1024, args.count * 2)},
        "log": {"level": "info"},
    }
    config_file = os.path.join(workdir, "config.json")
    with open(config_file, "w") as f:
        json.dump(config, f)
    log = open(os.path.join(workdir, "relay.log"), "w+")
    relay = subprocess.Popen([args.binary, "run", "--config", config_file], stderr=log)
    try:
        proxy_port = admin_port = None
        deadline = time.monotonic() + 30
        while proxy_port is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            log.seek(0)
            for line in log.read().splitlines():
                if "msg=listening" in line:
                    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                    proxy_port = int(fields["proxy"].rsplit(":", 1)[1])
                    admin_port = int(fields["admin"].rsplit(":", 1)[1])
        if proxy_port is None:
            raise SystemExit("tokenrelay did not start")

        connections = await asyncio.gather(*[connect(proxy_port) for _ in range(args.count)])
        held = [asyncio.create_task(one_request(c, "/held/%d" % i)) for i, c in enumerate(connections)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = await admin_json(admin_port, "/status")
            if status.get("held_requests", 0) >= args.count:
                break
            await asyncio.sleep(0.01)
        else:
            raise SystemExit("only %s requests were held" % status.get("held_requests"))
        tokens.release.set()
        results = await asyncio.gather(*held)
        replay = max(t for _, t in results) - tokens.answered_at
        bad = sum(1 for s, _ in results if s != 200)

        # The same shape without a hold: connections open, then every request sent at once.
        connections = await asyncio.gather(*[connect(proxy_port) for _ in range(args.count)])
        go = asyncio.Event()
        plain_tasks = [asyncio.create_task(one_request(c, "/plain/%d" % i, go)) for i, c in enumerate(connections)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        go.set()
        plain_results = await asyncio.gather(*plain_tasks)
        plain = max(t for _, t in plain_results) - started
        bad += sum(1 for s, _ in plain_results if s != 200)
        return replay, plain, bad, tokens.calls
    finally:
        relay.send_signal(signal.SIGTERM)
        try:
            relay.wait(timeout=20)
        except subprocess.TimeoutExpired:
            relay.kill()
            relay.wait()
        api.close()
        token_server.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--binary", default=".build/release/tokenrelay")
    args = parser.parse_args()
    replays, plains = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as workdir:
            replay, plain, bad, calls = asyncio.run(round_trip(args, workdir))
        replays.append(replay)
        plains.append(plain)
        print("round: replay %.1f ms, plain burst %.1f ms, non-200 %d, token calls %d"
              % (replay * 1000, plain * 1000, bad, calls), flush=True)
    replay, plain = statistics.median(replays), statistics.median(plains)
    print("held burst of %d (median of %d): replay %.1f ms after the token answer, plain burst %.1f ms, "
          "difference %.1f ms" % (args.count, args.rounds, replay * 1000, plain * 1000, (replay - plain) * 1000))


if __name__ == "__main__":
    sys.exit(main())

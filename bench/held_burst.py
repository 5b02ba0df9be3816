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
import statistics
import sys
import tempfile
import time

from relay_bench import (admin_json, connect, one_request, relay_config, serve, start_relay, stop_relays,
                         tokens_response, upstream_answer)

VALID = "fresh-access"


async def upstream(request):
    return upstream_answer(request[1], VALID)


class TokenEndpoint:
    def __init__(self):
        self.release = asyncio.Event()
        self.answered_at = None
        self.calls = 0

    async def answer(self, request):
        self.calls += 1
        await self.release.wait()
        self.answered_at = time.monotonic()
        return tokens_response(VALID, "r-%d" % self.calls)


async def round_trip(args, workdir):
    tokens = TokenEndpoint()
    api = await asyncio.start_server(serve(upstream), "127.0.0.1", 0, backlog=4096)
    token_server = await asyncio.start_server(serve(tokens.answer), "127.0.0.1", 0)
    api_port = api.sockets[0].getsockname()[1]
    token_port = token_server.sockets[0].getsockname()[1]
    token_file = os.path.join(workdir, "tokens.json")
    with open(token_file, "w") as f:
        json.dump({"access_token": "dead-access", "refresh_token": "r-0"}, f)
    os.chmod(token_file, 0o600)
    config_file = os.path.join(workdir, "config.json")
    with open(config_file, "w") as f:
        json.dump(relay_config(api_port, token_port, {"file": token_file}, args.count), f)
    relay = None
    try:
        relay, proxy_port, admin_port = await start_relay(args.binary, config_file, os.path.join(workdir, "relay.log"))

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
        if relay is not None:
            stop_relays([relay])
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

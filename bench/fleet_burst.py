#!/usr/bin/env python3
"""Fleet mode: N relays on one Redis, a burst spread over them after expiry.

One run, all on this machine (redis-server on a unix socket in a temporary directory, everything else on
127.0.0.1):
  1. The token set is imported into Redis (`tokenrelay token import`) and N relays start on it.
  2. The access token dies (the upstream accepts only the newest one from now on) and COUNT clients send at
     once, spread round-robin over the relays. The token endpoint holds its answer until every relay holds
     requests, so the whole burst waits on one refresh.
Measured:
  - refreshes: exchanges with the token endpoint (must be 1) and presentations of a spent refresh token
    (must be 0),
  - release: from the token answer leaving to the last held response arriving (issue goal: within 20 ms
    beyond the refresh round trip),
  - adoption: on every other relay, from the token endpoint's answer to that relay's adoption log line
    (millisecond log timestamps, one clock); this includes the refreshing relay's compare-and-set round trip,
    so it is an upper bound of the time from the publish to the adoption.

With --load-generator (the `fleet-burst-load` product), the burst's clients and the upstream are native
(on HTTPTransport, in two processes of their own) instead of asyncio in this one: Python's per-request cost
was most of the release figure. The token endpoint stays here (one request).

With --steady SECONDS (issue 24), no burst: the relays refresh proactively under steady load (--clients
connections in a loop, spread over the relays) with tokens living --lifetime seconds, and the upstream accepts
every access token until it expires (as most APIs do: a relay that has not adopted the newest set yet gets no
401). Measured: refreshes in the window, per second and per token lifetime, reuse and non-200 answers; run it
with --relays 1 for the rate the fleet must not exceed.

Usage: bench/fleet_burst.py [--relays 10] [--count 1000] [--binary .build/release/tokenrelay]
                            [--load-generator .build/release/fleet-burst-load]
       bench/fleet_burst.py --steady 12 --lifetime 2 [--clients 6] [--relays 3] [--binary ...]
"""
import argparse
import asyncio
import datetime
import json
import os
import subprocess
import tempfile
import time

from relay_bench import (admin_json, connect, http_get, json_response, one_request, relay_config, serve, start_relay,
                         stop_relays, tokens_response, upstream_answer)


class Identity:
    """Token endpoint with rotation and reuse detection, and the upstream that accepts one access token."""

    def __init__(self):
        self.valid_access = "access-0"
        self.current_refresh = "refresh-0"
        self.spent = set()
        self.calls = 0
        self.reuse = 0
        self.release = asyncio.Event()
        self.answered_at = None

    async def token_endpoint(self, request):
        self.calls += 1
        form = dict(part.split("=", 1) for part in request[2].decode().split("&") if "=" in part)
        await self.release.wait()
        presented = form.get("refresh_token")
        if presented != self.current_refresh:
            self.reuse += 1
            return json_response("400 Bad Request", b'{"error":"invalid_grant"}')
        self.spent.add(presented)
        self.current_refresh = "refresh-%d" % self.calls
        self.valid_access = "access-%d" % self.calls
        self.answered_at = time.monotonic()
        self.answered_wall = time.time()
        return tokens_response(self.valid_access, self.current_refresh)

    async def upstream(self, request):
        return upstream_answer(request[1], self.valid_access)


class SteadyIdentity:
    """Token endpoint with rotation and reuse detection whose tokens live `lifetime` seconds, and an upstream
    that accepts every access token issued until it expires."""

    def __init__(self, lifetime):
        self.lifetime = lifetime
        self.valid_access = "access-0"
        self.current_refresh = "refresh-0"
        self.expiry = {"access-0": time.monotonic() + lifetime}
        self.calls = 0
        self.reuse = 0

    async def token_endpoint(self, request):
        form = dict(part.split("=", 1) for part in request[2].decode().split("&") if "=" in part)
        if form.get("refresh_token") != self.current_refresh:
            self.reuse += 1
            return json_response("400 Bad Request", b'{"error":"invalid_grant"}')
        self.calls += 1
        self.current_refresh = "refresh-%d" % self.calls
        self.valid_access = "access-%d" % self.calls
        self.expiry[self.valid_access] = time.monotonic() + self.lifetime
        return json_response("200 OK", {"access_token": self.valid_access, "refresh_token": self.current_refresh,
                                        "expires_in": self.lifetime, "token_type": "Bearer"})

    async def upstream(self, request):
        token = request[1].get("authorization", "")[len("Bearer "):]
        if self.expiry.get(token, 0) > time.monotonic():
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        return b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 0\r\n\r\n"


async def steady(args, workdir):
    """(refreshes in the window, reuse, answers by status)."""
    identity = SteadyIdentity(args.lifetime)
    api = await asyncio.start_server(serve(identity.upstream), "127.0.0.1", 0, backlog=1024)
    token_server = await asyncio.start_server(serve(identity.token_endpoint), "127.0.0.1", 0)
    socket_path = os.path.join(workdir, "redis.sock")
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", socket_path, "--unixsocketperm", "700",
                              "--save", "", "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    relays = []
    try:
        for _ in range(200):
            if os.path.exists(socket_path):
                break
            await asyncio.sleep(0.02)
        config = relay_config(api.sockets[0].getsockname()[1], token_server.sockets[0].getsockname()[1],
                              {"redis": {"url": "unix://" + socket_path, "key": "bench:steady"}}, 1)
        config["refresh"]["proactive"] = True
        config_file = os.path.join(workdir, "config.json")
        with open(config_file, "w") as f:
            json.dump(config, f)
        seed = os.path.join(workdir, "seed.json")
        with open(seed, "w") as f:
            json.dump({"access_token": "access-0", "refresh_token": "refresh-0", "expires_in": args.lifetime}, f)
        subprocess.run([args.binary, "token", "import", "--config", config_file, "--from", seed], check=True, stdout=subprocess.DEVNULL)
        ports = []
        for index in range(args.relays):
            process, proxy, admin = await start_relay(args.binary, config_file, os.path.join(workdir, "relay-%d.log" % index))
            relays.append(process)
            ports.append((proxy, admin))
        for _, admin in ports:
            while (await admin_json(admin, "/status")).get("ready") is not True:
                await asyncio.sleep(0.02)
        answers = {}
        before = identity.calls
        deadline = time.monotonic() + args.steady

        async def client(index):
            n = 0
            while time.monotonic() < deadline:
                status, _ = await one_request(await connect(ports[(index + n) % len(ports)][0]), "/steady/%d/%d" % (index, n))
                answers[status] = answers.get(status, 0) + 1
                n += 1
        await asyncio.gather(*[client(i) for i in range(args.clients)])
        return identity.calls - before, identity.reuse, answers
    finally:
        stop_relays(relays)
        redis.terminate()
        redis.wait(timeout=10)
        api.close()
        token_server.close()


def cpu_seconds(pid):
    """utime + stime of a live process, from /proc (0 if it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def log_times(path, marker):
    times = []
    with open(path) as f:
        for line in f:
            if marker in line:
                stamp = next(part for part in line.split() if part.startswith("ts="))[3:]
                times.append(datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    return times


class NativeLoad:
    """The native upstream (`fleet-burst-load upstream`) and burst (`fleet-burst-load burst`)."""

    def __init__(self, binary):
        self.binary = binary
        self.upstream = None
        self.port = None
        self.burst = None

    async def start_upstream(self):
        self.upstream = await asyncio.create_subprocess_exec(self.binary, "upstream", stdout=asyncio.subprocess.PIPE)
        line = (await asyncio.wait_for(self.upstream.stdout.readline(), 10)).decode()
        if not line.startswith("listening "):
            raise SystemExit("fleet-burst-load upstream did not start: %r" % line)
        self.port = int(line.split()[1])
        return self.port

    async def kill_token(self, token):
        if int((await http_get(self.port, "/__kill?token=" + token)).split(b" ", 2)[1]) != 204:
            raise SystemExit("the native upstream refused the kill")

    async def start_burst(self, count, ports):
        self.burst = await asyncio.create_subprocess_exec(self.binary, "burst", str(count), *[str(p) for p in ports],
                                                          stdout=asyncio.subprocess.PIPE)

    async def burst_results(self, count):
        """(statuses by code, monotonic time of the last response)."""
        summary = json.loads(await asyncio.wait_for(self.burst.stdout.readline(), 60))
        await self.burst.wait()
        if summary["failures"]:
            print("burst failures: %s" % summary["failures"])
        statuses = {int(code): n for code, n in summary["statuses"].items()}
        return statuses, summary["last"], summary["answered"], summary["cpu_seconds"]

    async def stop(self):
        for process in (self.burst, self.upstream):
            if process is not None and process.returncode is None:
                process.terminate()
                await process.wait()


async def run(args, workdir):
    identity = Identity()
    native = NativeLoad(args.load_generator) if args.load_generator else None
    api = await asyncio.start_server(serve(identity.upstream), "127.0.0.1", 0, backlog=4096)
    api_port = await native.start_upstream() if native else api.sockets[0].getsockname()[1]
    token_server = await asyncio.start_server(serve(identity.token_endpoint), "127.0.0.1", 0)
    socket_path = os.path.join(workdir, "redis.sock")
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", socket_path, "--unixsocketperm", "700",
                              "--save", "", "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    relays = []
    try:
        for _ in range(200):
            if os.path.exists(socket_path):
                break
            await asyncio.sleep(0.02)
        token_port = token_server.sockets[0].getsockname()[1]
        config = relay_config(api_port, token_port, {"redis": {"url": "unix://" + socket_path, "key": "bench:fleet"}}, args.count)
        config_file = os.path.join(workdir, "config.json")
        with open(config_file, "w") as f:
            json.dump(config, f)
        seed = os.path.join(workdir, "seed.json")
        with open(seed, "w") as f:
            json.dump({"access_token": identity.valid_access, "refresh_token": identity.current_refresh}, f)
        subprocess.run([args.binary, "token", "import", "--config", config_file, "--from", seed], check=True, stdout=subprocess.DEVNULL)

        ports = []
        for index in range(args.relays):
            log_path = os.path.join(workdir, "relay-%d.log" % index)
            process, proxy, admin = await start_relay(args.binary, config_file, log_path)
            relays.append((process, log_path))
            ports.append((proxy, admin))
        for _, admin in ports:
            while (await admin_json(admin, "/status")).get("ready") is not True:
                await asyncio.sleep(0.02)

        if native:
            await native.kill_token(identity.valid_access)  # the access token dies for everyone
            await native.start_burst(args.count, [proxy for proxy, _ in ports])
        else:
            identity.valid_access = "dead"  # the access token dies for everyone
            async def request(port, path):  # each client connects in its own task, as a burst does
                return await one_request(await connect(port), path)
            burst = [asyncio.create_task(request(ports[i % len(ports)][0], "/burst/%d" % i)) for i in range(args.count)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            held = [(await admin_json(admin, "/status")).get("held_requests", 0) for _, admin in ports]
            if sum(held) >= args.count * 0.9 and all(h > 0 for h in held):
                break
            await asyncio.sleep(0.01)
        relays_cpu = sum(cpu_seconds(process.pid) for process, _ in relays)
        upstream_cpu = cpu_seconds(native.upstream.pid) if native else 0.0
        script_cpu = time.process_time()
        identity.release.set()
        if native:
            statuses, last, answered, burst_cpu = await native.burst_results(args.count)
            release = last - identity.answered_at
            print("responses after the token answer: first %.1f ms, p50 %.1f ms, p90 %.1f ms, p99 %.1f ms"
                  % tuple((t - identity.answered_at) * 1000 for t in answered))
            bad = args.count - statuses.get(200, 0)
        else:
            results = await asyncio.gather(*burst)
            release = max(t for _, t in results) - identity.answered_at
            bad = sum(1 for s, _ in results if s != 200)
        # CPU spent from the release to the last response (the native burst's includes its connects).
        relays_cpu = sum(cpu_seconds(process.pid) for process, _ in relays) - relays_cpu
        script_cpu = time.process_time() - script_cpu
        if native:
            print("cpu ms from the release: relays %.0f, native upstream %.0f, native clients %.0f (whole run), script %.0f"
                  % (relays_cpu * 1000, (cpu_seconds(native.upstream.pid) - upstream_cpu) * 1000, burst_cpu * 1000, script_cpu * 1000))
        else:
            print("cpu ms from the release: relays %.0f, script (asyncio clients and upstream) %.0f" % (relays_cpu * 1000, script_cpu * 1000))

        adoptions = []
        for _, path in relays:
            adopted = log_times(path, "adopted tokens")[1:]  # the first is each relay's start
            adoptions += [t - identity.answered_wall for t in adopted]
        return identity.calls, identity.reuse, bad, release, sorted(adoptions)
    finally:
        stop_relays([process for process, _ in relays])
        if native:
            await native.stop()
        redis.terminate()
        redis.wait(timeout=10)
        api.close()
        token_server.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relays", type=int, default=10)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--binary", default=".build/release/tokenrelay")
    parser.add_argument("--load-generator", default=None,
                        help="fleet-burst-load binary: native clients and upstream instead of asyncio ones")
    parser.add_argument("--steady", type=float, default=0, help="seconds of steady load instead of a burst")
    parser.add_argument("--lifetime", type=int, default=2, help="--steady: the access tokens' lifetime (s)")
    parser.add_argument("--clients", type=int, default=6, help="--steady: connections sending in a loop")
    args = parser.parse_args()
    if args.steady > 0:
        with tempfile.TemporaryDirectory() as workdir:
            refreshes, reuse, answers = asyncio.run(steady(args, workdir))
        print("relays %d, %.0f s of steady load, %d-s tokens: refreshes %d (%.2f per s, %.2f per token lifetime), reuse %d, answers %s"
              % (args.relays, args.steady, args.lifetime, refreshes, refreshes / args.steady, refreshes * args.lifetime / args.steady,
                 reuse, dict(sorted(answers.items()))))
        raise SystemExit(0 if reuse == 0 and set(answers) == {200} else 1)
    with tempfile.TemporaryDirectory() as workdir:
        calls, reuse, bad, release, adoptions = asyncio.run(run(args, workdir))
    p = lambda q: adoptions[min(len(adoptions) - 1, int(len(adoptions) * q))] * 1000 if adoptions else float("nan")
    print("relays %d, burst %d: refreshes %d (must be 1), reuse %d, non-200 %d" % (args.relays, args.count, calls, reuse, bad))
    print("release: last held response %.1f ms after the token answer" % (release * 1000))
    print("adoption on the other relays (%d): p50 %.1f ms, p99 %.1f ms, max %.1f ms"
          % (len(adoptions), p(0.5), p(0.99), (adoptions[-1] * 1000) if adoptions else float("nan")))
    raise SystemExit(0 if calls == 1 and reuse == 0 and bad == 0 else 1)


if __name__ == "__main__":
    main()

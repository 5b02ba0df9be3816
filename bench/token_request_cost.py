#!/usr/bin/env python3
"""What one token request costs tokenrelay with each client-authentication method (issue 20).

For each method a release tokenrelay (client_credentials grant) talks to the credential tests' token
endpoint (Tests/TokenRelayTests/Fixtures/assertion_token_endpoint.py, which verifies every assertion with
Python's `cryptography`), and N token requests are forced one after another with `POST /refresh` on the
admin port. Reported per token request:

  wall     the admin call's round trip: preparing the request (signing, reading the assertion file), the
           exchange with the endpoint (its verification included), the token file write;
  cpu      tokenrelay's CPU time, all threads (utime + stime of /proc/PID/stat, which keeps the time of
           threads that have ended: the helper threads that sign and write);
  loop     the CPU time of the event-loop thread alone (/proc/PID/task/PID/stat). Signing and file reads
           run on helper threads, so this stays the same whatever the method: no proxied request waits
           on a signature.

    bench/token_request_cost.py [--bin .build-bench/release/tokenrelay] [--count 400]

Needs python3-cryptography and openssl. Everything runs on 127.0.0.1 with ephemeral ports; every process
started is stopped by its PID.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDPOINT = os.path.join(REPO, "Tests/TokenRelayTests/Fixtures/assertion_token_endpoint.py")
TICK = os.sysconf("SC_CLK_TCK")
CLIENT_ID = "bench-client"


def run(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(condition, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError("timed out")


def cpu_seconds(pid, thread=None):
    path = f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


class Endpoint:
    def __init__(self, directory, settings):
        config = os.path.join(directory, f"endpoint-{len(os.listdir(directory))}.json")
        with open(config, "w") as f:
            json.dump(dict(settings, client_id=CLIENT_ID), f)
        self.out = open(config + ".out", "w+")
        self.process = subprocess.Popen([sys.executable, ENDPOINT, config], stdout=self.out, stderr=subprocess.DEVNULL)
        def ports():
            self.out.seek(0)
            line = self.out.readline()
            return line.split() if line.endswith("\n") else None
        ports = wait_for(ports)
        self.token_port, self.control_port = int(ports[0]), int(ports[1])
        self.tls = "cert" in settings

    @property
    def token_url(self):
        return f"{'https://localhost' if self.tls else 'http://127.0.0.1'}:{self.token_port}/token"

    def mint(self, sub, aud):
        request = urllib.request.Request(f"http://127.0.0.1:{self.control_port}/mint", method="POST",
                                         data=json.dumps({"sub": sub, "aud": aud, "lifetime": 3600}).encode())
        return json.load(urllib.request.urlopen(request))["token"]

    def stats(self):
        return json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.control_port}/stats"))

    def stop(self):
        self.process.terminate()
        self.process.wait(5)
        self.out.close()


class Relay:
    def __init__(self, binary, directory, refresh, env):
        workdir = tempfile.mkdtemp(dir=directory)
        config = {"listen": "127.0.0.1:0", "upstream": {"url": "http://127.0.0.1:9"},
                  "tokens": {"file": os.path.join(workdir, "tokens.json")}, "refresh": refresh,
                  "admin": {"listen": "127.0.0.1:0"}, "log": {"level": "info"}}
        path = os.path.join(workdir, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.stderr = open(os.path.join(workdir, "stderr.log"), "w+")
        self.process = subprocess.Popen([binary, "run", "--config", path], stdout=subprocess.DEVNULL, stderr=self.stderr,
                                        env=dict(os.environ, **env))

        def listening():
            self.stderr.seek(0)
            match = re.search(r"admin=127\.0\.0\.1:(\d+)", self.stderr.read())
            if self.process.poll() is not None:
                raise RuntimeError("tokenrelay exited: " + self.stderr.read())
            return match and int(match.group(1))
        self.admin_port = wait_for(listening)

    def refresh(self):
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}/refresh", method="POST", data=b"")
        with urllib.request.urlopen(request) as response:
            response.read()

    def stop(self):
        self.process.terminate()
        self.process.wait(10)
        self.stderr.close()


def make_pki(directory):
    def path(name):
        return os.path.join(directory, name)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2", "-subj", "/CN=bench CA")
    for name, cn, ext in (("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                          ("client", "tls-test-client", "extendedKeyUsage=clientAuth")):
        run("openssl", "req", *ec, "-keyout", path(f"{name}.key"), "-out", path(f"{name}.csr"), "-subj", f"/CN={cn}")
        with open(path(f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        run("openssl", "x509", "-req", "-in", path(f"{name}.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
            "-set_serial", str(int.from_bytes(os.urandom(4), "big")), "-extfile", path(f"{name}.ext"), "-out", path(f"{name}.pem"), "-days", "2")
    return path


def make_key(directory, kind):
    path = os.path.join(directory, f"{kind}.pem")
    options = {"RSA-2048": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
               "P-256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
               "P-384": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
               "Ed25519": ["-algorithm", "ED25519"]}[kind]
    run("openssl", "genpkey", *options, "-out", path)
    return path


def methods(directory):
    """(label, endpoint settings, refresh settings minus token_url, environment, prepare(endpoint, refresh))"""
    pki = make_pki(directory)
    secret_file = os.path.join(directory, "client_secret")
    with open(secret_file, "w") as f:
        f.write("bench-secret\n")
    base = {"grant": "client_credentials", "client_id": CLIENT_ID}
    yield "client_secret_basic", {"client_auth": "none"}, dict(base, client_auth="client_secret_basic", client_secret_file=secret_file), None
    yield "client_secret_post", {"client_auth": "client_secret_post", "client_secret": "bench-secret"}, \
        dict(base, client_auth="client_secret_post", client_secret_file=secret_file), None
    for kind, alg in (("RSA-2048", "RS256"), ("RSA-2048", "PS256"), ("P-256", "ES256"), ("P-384", "ES384"), ("Ed25519", "EdDSA")):
        key = make_key(directory, kind)
        yield f"private_key_jwt {alg} ({kind})", {"client_auth": "private_key_jwt", "client_key": key}, \
            dict(base, client_auth="private_key_jwt", client_key_file=key, client_assertion_alg=alg), None
    assertion_file = os.path.join(directory, "projected-token")

    def write_assertion(endpoint, _refresh):
        with open(assertion_file, "w") as f:
            f.write(endpoint.mint("system:serviceaccount:bench:relay", "api://AzureADTokenExchange"))
    yield "private_key_jwt, client_assertion_file", \
        {"client_auth": "private_key_jwt", "federated_subject": "system:serviceaccount:bench:relay", "federated_audience": "api://AzureADTokenExchange"}, \
        dict(base, client_auth="private_key_jwt", client_assertion_file=assertion_file), write_assertion
    tls = {"cert": pki("server.pem"), "key": pki("server.key")}
    yield "client_secret_post over TLS", dict(tls, client_auth="client_secret_post", client_secret="bench-secret"), \
        dict(base, client_auth="client_secret_post", client_secret_file=secret_file, tls={"ca_file": pki("ca.pem")}), None
    yield "tls_client_auth (TLS, P-256 client certificate)", dict(tls, client_auth="tls_client_auth", client_ca=pki("ca.pem")), \
        dict(base, client_auth="tls_client_auth", tls={"ca_file": pki("ca.pem"), "client_cert": pki("client.pem"), "client_key": pki("client.key")}), None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(REPO, ".build-bench/release/tokenrelay"))
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    print(f"binary {args.bin}; {args.count} token requests per method, one at a time (POST /refresh)")
    print(f"{'method':48} {'wall p50':>9} {'wall p90':>9} {'cpu/req':>9} {'loop/req':>9}")
    with tempfile.TemporaryDirectory(prefix="token-request-cost-") as directory:
        for label, endpoint_settings, refresh, prepare in methods(directory):
            endpoint = Endpoint(directory, endpoint_settings)
            relay = None
            try:
                refresh = dict(refresh, token_url=endpoint.token_url)
                if prepare:
                    prepare(endpoint, refresh)
                relay = Relay(args.bin, directory, refresh, {})
                for _ in range(args.warmup):
                    relay.refresh()
                pid = relay.process.pid
                cpu0, loop0 = cpu_seconds(pid), cpu_seconds(pid, pid)
                walls = []
                for _ in range(args.count):
                    start = time.perf_counter()
                    relay.refresh()
                    walls.append(time.perf_counter() - start)
                cpu, loop = cpu_seconds(pid) - cpu0, cpu_seconds(pid, pid) - loop0
                stats = endpoint.stats()
                assert not stats["refusals"], stats["refusals"][:3]
                # One token request per POST /refresh (the token fetched at start may be the first warm-up's).
                assert stats["granted"] in (args.count + args.warmup, args.count + args.warmup + 1), stats["granted"]
                walls.sort()
                print(f"{label:48} {walls[len(walls) // 2] * 1e3:7.2f}ms {walls[len(walls) * 9 // 10] * 1e3:7.2f}ms "
                      f"{cpu / args.count * 1e6:7.0f}µs {loop / args.count * 1e6:7.0f}µs", flush=True)
            finally:
                if relay:
                    relay.stop()
                endpoint.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The h2 scenario (bench/run.sh with SCENARIOS=h2 runs this): h2load (Debian's nghttp2-client) speaking
# HTTP/2 with prior knowledge (h2c) to a proxy, which forwards to an HTTP/1.1 upstream (nginx, /small, a
# 100-byte body) with the token injected. tokenrelay beside nginx doing the same: `listen ... http2`
# without TLS (h2c) and `proxy_pass` over HTTP/1.1 keep-alive with the same Authorization header.
# proxy_pass: both translate HTTP/2 streams into HTTP/1.1 requests, and the comparison is like for like.
#
# UPSTREAM=h2c: the upstream nginx serves /small over h2c too, tokenrelay forwards with upstream.http2
# "prior_knowledge" (streams multiplexed on few connections) and nginx with grpc_pass (its only module
# that speaks HTTP/2 to an upstream; it carries plain requests as well, over h2c keep-alive connections).
#
#   bench/h2.sh                                  # about 2 minutes after the build
#   ROUNDS=1 REQUESTS=50000 SKIP_BUILD=1 bench/h2.sh
#   UPSTREAM=h2c bench/h2.sh
#
# Knobs (environment):
#   REQUESTS   requests per measured h2load run               (default 200000)
#   CLIENTS    h2load connections (-c)                         (default 8)
#   STREAMS    concurrent streams per connection (-m)          (default 32)
#   ROUNDS     interleaved rounds; the table shows medians    (default 3)
#   COUNT      requests per strace count                       (default 20000)
#   PIN=0      do not pin (default: proxies on CPU 0, upstream and h2load on CPU 1)
#   BASE_PORT  first of 4 consecutive 127.0.0.1 ports          (default 18640)
#   SKIP_BUILD=1  use the existing release binary
#   PERF=1     afterwards, a perf profile of tokenrelay over one more run (bench/results/perf-h2.txt)
#
# Per proxy: CPU per request (the proxy's user + system time over the run, from /proc, divided by the
# requests), req/s, p99 latency (from h2load's per-request log), system calls per request (strace -c -f
# over COUNT requests).
set -euo pipefail

REQUESTS=${REQUESTS:-200000}
CLIENTS=${CLIENTS:-8}
STREAMS=${STREAMS:-32}
ROUNDS=${ROUNDS:-3}
COUNT=${COUNT:-20000}
PIN=${PIN:-1}
BASE_PORT=${BASE_PORT:-18640}
SKIP_BUILD=${SKIP_BUILD:-0}
UPSTREAM=${UPSTREAM:-http1}
[[ "$UPSTREAM" == http1 || "$UPSTREAM" == h2c ]] || { echo "UPSTREAM must be http1 or h2c" >&2; exit 2; }

BENCH_LOG_TAG=bench-h2
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # BENCH_DIR, REPO_DIR, RESULTS_DIR, SCRATCH, log/die, PIDS/TMP cleanup
BIN=$SCRATCH/release/tokenrelay
UP_PORT=$BASE_PORT NGX_PORT=$((BASE_PORT + 1)) TR_PORT=$((BASE_PORT + 2)) TR_ADMIN_PORT=$((BASE_PORT + 3))
TOKEN=bench-token-123456

command -v h2load >/dev/null 2>&1 || die "h2load missing: apt-get install nghttp2-client"
command -v strace >/dev/null 2>&1 || die "strace missing"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx not found"
"$NGINX" -V 2>&1 | grep -q http_v2_module || die "this nginx has no http_v2_module"
CLK_TCK=$(getconf CLK_TCK)
PROXY_CPU=(); LOAD_CPU=()
if [[ "$PIN" == 1 && $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1; then
    PROXY_CPU=(taskset -c 0); LOAD_CPU=(taskset -c 1)
fi

if [[ "$SKIP_BUILD" != 1 || ! -x "$BIN" ]]; then
    log "building tokenrelay (release)"
    (cd "$REPO_DIR" && swift build -c release --static-swift-stdlib --scratch-path "$SCRATCH" --product tokenrelay 2>&1 | tail -n 3) >&2
fi
[[ -x "$BIN" ]] || die "tokenrelay binary missing: $BIN"
for p in $(seq "$BASE_PORT" $((BASE_PORT + 3))); do
    [[ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]] || die "port $p is in use; pick another range with BASE_PORT=..."
done

mkdir -p "$RESULTS_DIR"
TMP=$(mktemp -d /tmp/tokenrelay-bench-h2.XXXXXX)
chmod 0755 "$TMP"
mkdir -p "$TMP/up" "$TMP/ngx" "$TMP/tr"
SMALL_BODY=$(printf 'x%.0s' $(seq 1 99))

nginx_conf() { # $1 = prefix, $2 = server block
    cat <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 30000; }
http {
    access_log off;
    client_body_temp_path $1/client_body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
$2
}
EOF
}
UP_HTTP2=""; TR_HTTP2=""
[[ "$UPSTREAM" == h2c ]] && UP_HTTP2=" http2" && TR_HTTP2=', "http2": "prior_knowledge"'
nginx_conf "$TMP/up" "    http2_max_concurrent_streams 128;
    server {
        listen 127.0.0.1:$UP_PORT$UP_HTTP2 backlog=4096;
        location = /small { return 200 \"$SMALL_BODY\n\"; }
    }" >"$TMP/up/nginx.conf"
if [[ "$UPSTREAM" == h2c ]]; then
    ngx_location="            grpc_pass grpc://backend;
            grpc_set_header Authorization \"Bearer $TOKEN\";"
else
    ngx_location="            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Authorization \"Bearer $TOKEN\";"
fi
nginx_conf "$TMP/ngx" "    http2_max_concurrent_streams 128;
    upstream backend { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NGX_PORT http2 backlog=4096;
        location / {
$ngx_location
        }
    }" >"$TMP/ngx/nginx.conf"
printf '{"access_token":"%s","refresh_token":"bench-refresh-123456"}\n' "$TOKEN" >"$TMP/tr/tokens.json"
chmod 0600 "$TMP/tr/tokens.json"
cat >"$TMP/tr/tokenrelay.json" <<EOF
{ "listen": "127.0.0.1:$TR_PORT",
  "upstream": { "url": "http://127.0.0.1:$UP_PORT"$TR_HTTP2 },
  "tokens": { "file": "$TMP/tr/tokens.json" },
  "refresh": { "grant": "refresh_token", "token_url": "http://127.0.0.1:9/oauth/token", "client_id": "bench", "client_auth": "none" },
  "admin": { "listen": "127.0.0.1:$TR_ADMIN_PORT" },
  "limits": { "max_client_connections": 20000, "max_concurrent_streams": 128 } }
EOF

"${LOAD_CPU[@]}" "$NGINX" -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/out.log" 2>&1 &
PIDS+=($!)
"${PROXY_CPU[@]}" "$NGINX" -p "$TMP/ngx" -c "$TMP/ngx/nginx.conf" >"$TMP/ngx/out.log" 2>&1 &
PIDS+=($!)
NGX_MASTER=$!
"${PROXY_CPU[@]}" "$BIN" run --config "$TMP/tr/tokenrelay.json" >"$TMP/tr/out.log" 2>"$TMP/tr/err.log" &
PIDS+=($!)
TR_PID=$!
for port in "$UP_PORT" "$NGX_PORT" "$TR_PORT"; do
    for _ in $(seq 1 100); do [[ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ]] && break; sleep 0.1; done
    [[ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ]] || die "nothing listens on $port (see $TMP)"
done
NGX_WORKER=""
for _ in $(seq 1 50); do NGX_WORKER=$(pgrep -P "$NGX_MASTER" | head -n 1 || true); [[ -n "$NGX_WORKER" ]] && break; sleep 0.1; done
[[ -n "$NGX_WORKER" ]] || die "no nginx worker"
declare -A PORT_OF=([nginx]=$NGX_PORT [tokenrelay]=$TR_PORT)
declare -A PID_OF=([nginx]=$NGX_WORKER [tokenrelay]=$TR_PID)

# Both answer with the upstream's body, and over HTTP/2.
for proxy in nginx tokenrelay; do
    body=$(curl -sS --http2-prior-knowledge "http://127.0.0.1:${PORT_OF[$proxy]}/small")
    [[ "$body" == "$SMALL_BODY" ]] || die "$proxy answered '$body'"
done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

declare -A RPS CPU P99 SYSCALLS
run_once() { # proxy round
    local proxy=$1 round=$2 port=${PORT_OF[$1]} pid=${PID_OF[$1]} out before after requests
    "${LOAD_CPU[@]}" h2load -n 20000 -c "$CLIENTS" -m "$STREAMS" "http://127.0.0.1:$port/small" >/dev/null 2>&1 || true
    before=$(cpu_ticks "$pid")
    out=$("${LOAD_CPU[@]}" h2load -n "$REQUESTS" -c "$CLIENTS" -m "$STREAMS" --log-file="$TMP/lat-$proxy-$round.tsv" \
        "http://127.0.0.1:$port/small" 2>&1)
    after=$(cpu_ticks "$pid")
    requests=$(awk '/^requests:/ { print $8 }' <<<"$out")
    [[ "$requests" == "$REQUESTS" ]] || die "$proxy: only $requests of $REQUESTS succeeded: $out"
    RPS[$proxy,$round]=$(awk '/^finished in/ { gsub(",", "", $4); print $4 }' <<<"$out")
    CPU[$proxy,$round]=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$requests" 'BEGIN { printf "%.2f", t / hz / n * 1e6 }')
    P99[$proxy,$round]=$(awk '{ print $3 }' "$TMP/lat-$proxy-$round.tsv" | sort -n |
        awk '{ v[NR] = $1 } END { i = int(NR * 0.99); if (i < 1) i = 1; printf "%.2f", v[i] / 1000 }')
}
for round in $(seq 1 "$ROUNDS"); do
    for proxy in tokenrelay nginx; do
        log "round $round: $proxy"
        run_once "$proxy" "$round"
    done
done
for proxy in tokenrelay nginx; do
    strace -c -f -q -p "${PID_OF[$proxy]}" -o "$TMP/strace-$proxy.txt" &
    spid=$!
    sleep 1
    "${LOAD_CPU[@]}" h2load -n "$COUNT" -c "$CLIENTS" -m "$STREAMS" "http://127.0.0.1:${PORT_OF[$proxy]}/small" >/dev/null 2>&1
    kill -INT "$spid"; wait "$spid" 2>/dev/null || true
    # strace -c columns: % time, seconds, usecs/call, calls, [errors], syscall; "total" last.
    SYSCALLS[$proxy]=$(awk -v n="$COUNT" '$NF == "total" { printf "%.2f", $4 / n }' "$TMP/strace-$proxy.txt")
done

if [[ "${PERF:-0}" == 1 ]]; then
    # Where tokenrelay's CPU goes on this path: perf's flat profile over one more run.
    perf record -q -g -p "$TR_PID" -o "$TMP/perf.data" &
    ppid=$!
    sleep 1
    "${LOAD_CPU[@]}" h2load -n "$REQUESTS" -c "$CLIENTS" -m "$STREAMS" "http://127.0.0.1:$TR_PORT/small" >/dev/null 2>&1
    kill -INT "$ppid"; wait "$ppid" 2>/dev/null || true
    perf report -q -i "$TMP/perf.data" --stdio --no-children --sort symbol 2>/dev/null | grep -v '^$' | grep -v '^ *|' | grep -v '^ *-' |
        head -n 60 >"$RESULTS_DIR/perf-h2.txt"
    log "perf profile in ${RESULTS_DIR#"$REPO_DIR"/}/perf-h2.txt"
fi

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
report="$RESULTS_DIR/h2-$UPSTREAM-$(date -u +%Y%m%d-%H%M%S).txt"
{
    printf 'h2load -c %s -m %s, %s requests of /small (100-byte body) per run, %s rounds, medians; upstream %s\n' "$CLIENTS" "$STREAMS" "$REQUESTS" "$ROUNDS" "$UPSTREAM"
    printf '%-12s %14s %12s %10s %16s\n' proxy "CPU us/req" "req/s" "p99 ms" "syscalls/req"
    for proxy in tokenrelay nginx; do
        cpu=$(for r in $(seq 1 "$ROUNDS"); do echo "${CPU[$proxy,$r]}"; done | median)
        rps=$(for r in $(seq 1 "$ROUNDS"); do echo "${RPS[$proxy,$r]}"; done | median)
        p99=$(for r in $(seq 1 "$ROUNDS"); do echo "${P99[$proxy,$r]}"; done | median)
        printf '%-12s %14s %12s %10s %16s\n' "$proxy" "$cpu" "$rps" "$p99" "${SYSCALLS[$proxy]}"
    done
} | tee "$report"
log "written to ${report#"$REPO_DIR"/}"

#!/usr/bin/env bash
# Benchmark tokenrelay against nginx as a reverse proxy, on 127.0.0.1 only, in one run: tokenrelay on both
# engines of its proxied port (`data_plane: "transport"`, the default, and `"evhttp"`, the old one) beside
# nginx (1 worker, keep-alive upstream pool, the same header injection).
#
#   bench/run.sh                      # defaults below; about 6-9 minutes
#   ROUNDS=1 DURATION=5 CALLGRIND=0 bench/run.sh   # quick look
#
# Knobs (environment):
#   DURATION           seconds per measured wrk run                         (default 8)
#   WARMUP             seconds of warm-up before each run                   (default 2)
#   ROUNDS             interleaved rounds; the table shows medians          (default 3)
#   CONNECTIONS        wrk connections, /small                              (default 64)
#   LARGE_CONNECTIONS  wrk connections, /large                              (default 8)
#   COUNT_SMALL        requests per strace count, /small                    (default 5000)
#   COUNT_LARGE        requests per strace count, /large                    (default 300)
#   LARGE_BYTES        size of the /large body                              (default 1048576)
#   CALLGRIND=0        skip the user-space instruction count (valgrind callgrind)
#   CG_SMALL/CG_LARGE  requests per callgrind count                         (default 1000 / 40)
#   EVHTTP=1           also a second tokenrelay with `data_plane: evhttp` (retired: since the engine was removed
#                      it runs on the transport too; the evhttp figures in bench/README.md are from before)
#   BENCH_RELAY=1      also measure transport-bench-relay (HTTPTransport under a minimal relay, no lifecycle)
#   CG_KEEP=1          keep the callgrind dumps in bench/results/callgrind-PROXY-PATH.out
#   IDLE_CLIENTS       idle keep-alive connections held open for the RSS figure (default 10000; 0 skips)
#   PIN=0              do not pin (default: proxies on CPU 0, upstream and wrk on CPU 1)
#   BASE_PORT          first of 13 consecutive 127.0.0.1 ports              (default 18590)
#   SKIP_BUILD=1       use the existing binary as is
#   PERF=1             afterwards, `perf record -g` tokenrelay during one more /small run
#   UPSTREAM_TLS=1     the upstream served over TLS (the upstream nginx's own `listen ssl`, a throwaway CA and
#                      certificate made with openssl in the temp dir): nginx proxies with `proxy_pass https://`,
#                      `proxy_ssl_session_reuse on` and verification against that CA, tokenrelay with
#                      `upstream.tls.ca_file`; the table adds upstream TLS handshakes per 1,000 requests and
#                      the share resumed (from the upstream's log of each connection's first request).
#                      Defaults to SCENARIOS=small.
#   UPSTREAM_KEEPALIVE_REQUESTS=N  the upstream closes each connection after N requests (default 1000000), so
#                      reconnects (and, with UPSTREAM_TLS=1, handshakes and resumption) count
#   SCENARIOS          which paths to time, "small large" by default; "h2" alone runs bench/h2.sh (h2load
#                      with prior knowledge → proxy → HTTP/1.1 upstream, tokenrelay beside nginx `listen ... http2`)
#   ROUTES=N           N routes matched by path prefix (/route-0/ ...), none matching a measured path: every request
#                      is looked up through all of them before it goes to the top-level upstream (default 0)
#   DPOP=ES256|EdDSA|ES384|RS256|PS256   tokenrelay signs a DPoP proof for every request (`dpop` with a key made by openssl, the token
#                      file's tokens bound to it), nginx stays plain bearer; the report adds `openssl speed` of one
#                      signature of that alg, measured in the same run, and the goal CPU <= nginx + 1.3 x signature
#   RATE=N             the timed runs offer N requests/s (h2load --h1 at a fixed rate per connection, CONNECTIONS
#                      of them) instead of wrk's closed loop: CPU per request at the same load for every proxy,
#                      with none of them the bottleneck (which changes what the kernel does per request: see
#                      bench/README.md, "Where DPoP's CPU goes"); p50/p99 from h2load's per-request log
#   OLD_BIN=path       with EVHTTP=1: the `evhttp` instance runs this binary (an old build that still has the
#                      evhttp engine, e.g. one built at a4db024) instead of this tree's
#
# See bench/README.md for what is measured and how to read the output.
set -euo pipefail

DURATION=${DURATION:-8}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
LARGE_CONNECTIONS=${LARGE_CONNECTIONS:-8}
COUNT_SMALL=${COUNT_SMALL:-5000}
COUNT_LARGE=${COUNT_LARGE:-300}
LARGE_BYTES=${LARGE_BYTES:-1048576}
CALLGRIND=${CALLGRIND:-1}
CG_SMALL=${CG_SMALL:-1000}
CG_LARGE=${CG_LARGE:-40}
# tokenrelay's release build always links the Swift runtime statically (Package.swift), as deployed.
STDLIB=static
EVHTTP=${EVHTTP:-0}
ROUTES=${ROUTES:-0}
BENCH_RELAY=${BENCH_RELAY:-0}
CG_KEEP=${CG_KEEP:-0}
IDLE_CLIENTS=${IDLE_CLIENTS:-10000}
# 10,000 idle clients need descriptors: raise the limit for everything started from here.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
PIN=${PIN:-1}
BASE_PORT=${BASE_PORT:-18590}
SKIP_BUILD=${SKIP_BUILD:-0}
PERF=${PERF:-0}
UPSTREAM_TLS=${UPSTREAM_TLS:-0}
UPSTREAM_KEEPALIVE_REQUESTS=${UPSTREAM_KEEPALIVE_REQUESTS:-1000000}
if [[ "$UPSTREAM_TLS" == 1 ]]; then SCENARIOS_DEFAULT=small; else SCENARIOS_DEFAULT="small large"; fi
read -r -a SCENARIOS <<<"${SCENARIOS:-$SCENARIOS_DEFAULT}"
OLD_BIN=${OLD_BIN:-}
RATE=${RATE:-}
# The HTTP/2 scenario (h2load with prior knowledge, beside nginx's `listen ... http2`) has its own script.
if [[ "${SCENARIOS[*]}" == h2 ]]; then exec "$(dirname "${BASH_SOURCE[0]}")/h2.sh"; fi

BENCH_LOG_TAG=bench
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # BENCH_DIR, REPO_DIR, RESULTS_DIR, SCRATCH, log/die, PIDS/TMP cleanup
BUILD_FLAGS=(--static-swift-stdlib)
BIN=$SCRATCH/release/tokenrelay
RELAY_BIN=$SCRATCH/release/transport-bench-relay

UP_PORT=$BASE_PORT                 # upstream nginx
NGX_PORT=$((BASE_PORT + 1))        # nginx reverse proxy
CG_NGX_PORT=$((BASE_PORT + 2))     # nginx under callgrind
# tokenrelay, one instance per engine (proxy name = engine name), each with its admin port, and a second
# instance of each under callgrind.
declare -A TR_PORT_OF=([transport]=$((BASE_PORT + 3)) [evhttp]=$((BASE_PORT + 5)))
declare -A TR_ADMIN_PORT_OF=([transport]=$((BASE_PORT + 4)) [evhttp]=$((BASE_PORT + 6)))
declare -A CG_TR_PORT_OF=([transport]=$((BASE_PORT + 7)) [evhttp]=$((BASE_PORT + 9)))
declare -A CG_TR_ADMIN_PORT_OF=([transport]=$((BASE_PORT + 8)) [evhttp]=$((BASE_PORT + 10)))
RL_PORT=$((BASE_PORT + 11))        # transport-bench-relay
CG_RL_PORT=$((BASE_PORT + 12))     # transport-bench-relay under callgrind
UP_TLS_PORT=$((BASE_PORT + 13))    # upstream nginx over TLS (UPSTREAM_TLS=1)
ENGINES=(transport)
if [[ "$EVHTTP" == 1 ]]; then ENGINES=(evhttp transport); fi
declare -A BIN_OF=([transport]=$BIN [evhttp]=${OLD_BIN:-$BIN})
TOKEN=bench-token-123456


# ---------------------------------------------------------------- deps
need_pkgs=()
command -v wrk >/dev/null 2>&1 || need_pkgs+=(wrk)
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || need_pkgs+=(nginx-light)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
if [[ "$CALLGRIND" == 1 ]]; then command -v callgrind_control >/dev/null 2>&1 || need_pkgs+=(valgrind); fi
if ((${#need_pkgs[@]})); then
    [[ $(id -u) -eq 0 ]] || die "missing ${need_pkgs[*]} and not root; install them first"
    export DEBIAN_FRONTEND=noninteractive
    log "installing ${need_pkgs[*]}"
    if ! apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null 2>&1; then
        apt-get update -q >/dev/null
        if ! apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null; then
            # nginx-light does not exist on every release; fall back to nginx
            need_pkgs=("${need_pkgs[@]/nginx-light/nginx}")
            apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null
        fi
    fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx not found"
CLK_TCK=$(getconf CLK_TCK)

# Pinning: the proxy under test on CPU 0, everything else (upstream, wrk) on CPU 1, so the proxies compete
# with the load generator the same way. On a 1-CPU machine pinning is meaningless and skipped.
PROXY_CPU=(); LOAD_CPU=()
if [[ "$PIN" == 1 && $(nproc) -ge 2 ]] && command -v taskset >/dev/null 2>&1; then
    PROXY_CPU=(taskset -c 0); LOAD_CPU=(taskset -c 1)
fi

# ---------------------------------------------------------------- build
if [[ "$SKIP_BUILD" != 1 || ! -x "$BIN" ]]; then
    log "building tokenrelay (release, $STDLIB Swift runtime, scratch path ${SCRATCH#"$REPO_DIR"/})"
    (cd "$REPO_DIR" && swift build -c release "${BUILD_FLAGS[@]}" --scratch-path "$SCRATCH" --product tokenrelay 2>&1 | tail -n 3) >&2
    if [[ "$BENCH_RELAY" == 1 ]]; then
        (cd "$REPO_DIR" && swift build -c release "${BUILD_FLAGS[@]}" --scratch-path "$SCRATCH" --product transport-bench-relay 2>&1 | tail -n 1) >&2
    fi
fi
if [[ "$BENCH_RELAY" == 1 && ! -x "$RELAY_BIN" ]]; then die "transport-bench-relay missing: $RELAY_BIN (run without SKIP_BUILD=1)"; fi
[[ -x "$BIN" ]] || die "tokenrelay binary missing: $BIN"
[[ -z "$OLD_BIN" || -x "$OLD_BIN" ]] || die "OLD_BIN is not an executable: $OLD_BIN"
[[ "$UPSTREAM_TLS" != 1 || "$BENCH_RELAY" != 1 ]] || die "BENCH_RELAY=1 speaks plain HTTP to the upstream; not with UPSTREAM_TLS=1"

# ---------------------------------------------------------------- ports
for p in $(seq "$BASE_PORT" $((BASE_PORT + 13))); do
    if [[ -n "$(ss -Htln "sport = :$p" 2>/dev/null)" ]]; then
        die "port $p is in use; pick another range with BASE_PORT=..."
    fi
done

# ---------------------------------------------------------------- temp dir
mkdir -p "$RESULTS_DIR"
TMP=$(mktemp -d /tmp/tokenrelay-bench.XXXXXX)
# nginx workers started by root run as 'nobody' and must read /large.
chmod 0755 "$TMP"
mkdir -p "$TMP/www" "$TMP/up" "$TMP/ngx" "$TMP/cgngx" "$TMP/cg"
head -c "$LARGE_BYTES" /dev/urandom >"$TMP/www/large"
chmod 0644 "$TMP/www/large"
LARGE_SHA=$(sha256sum "$TMP/www/large" | cut -d' ' -f1)
SMALL_BODY=$(printf 'x%.0s' $(seq 1 99))   # 99 bytes + "\n" = 100-byte body

# A fixed number of requests with wrk (bench/wrk-count.lua).
cp "$BENCH_DIR/wrk-count.lua" "$TMP/count.lua"

nginx_main() { # $1 = prefix dir, $2 = master_process on|off
    cat <<EOF
daemon off;
master_process $2;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 30000; }
EOF
}
nginx_http() { # $1 = prefix dir
    cat <<EOF
    access_log off;
    client_body_temp_path $1/client_body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
    default_type application/octet-stream;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
EOF
}

# Upstream: 100-byte body at /small, 1 MiB static file at /large, /check echoes Authorization.
{
    nginx_main "$TMP/up" on
    echo "http {"
    nginx_http "$TMP/up"
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        cat <<'EOF'
    log_format tlsconn '$ssl_session_reused';
    map "$https:$connection_requests" $first_request_over_tls { "on:1" 1; default 0; }
EOF
    fi
    cat <<EOF
    sendfile on;
    tcp_nopush on;
    server {
        listen 127.0.0.1:$UP_PORT backlog=4096;
EOF
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        # One line per upstream connection (its first request): whether its TLS session was resumed.
        cat <<EOF
        listen 127.0.0.1:$UP_TLS_PORT ssl backlog=4096;
        ssl_certificate $TMP/tls/server.pem;
        ssl_certificate_key $TMP/tls/server.key;
        ssl_session_cache shared:upstream:4m;
        ssl_session_timeout 1h;
        access_log $TMP/up/tls-connections.log tlsconn if=\$first_request_over_tls;
EOF
    fi
    cat <<EOF
        keepalive_requests $UPSTREAM_KEEPALIVE_REQUESTS;
        location = /large { root $TMP/www; }
        location = /check { return 200 "\$http_authorization\n"; }
        location = /small { return 200 "$SMALL_BODY\n"; }
    }
}
EOF
} >"$TMP/up/nginx.conf"

proxy_nginx_conf() { # $1 = prefix, $2 = port, $3 = master_process
    nginx_main "$1" "$3"
    echo "http {"
    nginx_http "$1"
    cat <<EOF
    upstream backend {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$2 backlog=4096;
        location / {
            proxy_pass $UPSTREAM_SCHEME://backend;
$(if [[ "$UPSTREAM_TLS" == 1 ]]; then cat <<EOT
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate $TMP/tls/ca.pem;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
EOT
fi)
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer $TOKEN";
            # stream 1 MiB bodies through memory buffers, never via temp files
            proxy_max_temp_file_size 0;
        }
    }
}
EOF
}
if [[ "$UPSTREAM_TLS" == 1 ]]; then
    # Both proxies trust only the throwaway CA.
    make_upstream_ca "$TMP/tls"
    UPSTREAM_PORT=$UP_TLS_PORT; UPSTREAM_SCHEME=https
else
    UPSTREAM_PORT=$UP_PORT; UPSTREAM_SCHEME=http
fi
proxy_nginx_conf "$TMP/ngx" "$NGX_PORT" on >"$TMP/ngx/nginx.conf"
# Under valgrind nginx runs as one process (no master), which is then the worker.
proxy_nginx_conf "$TMP/cgngx" "$CG_NGX_PORT" off >"$TMP/cgngx/nginx.conf"

DPOP=${DPOP:-}
DPOP_JSON=""
if [[ -n "$DPOP" ]]; then
    # The key and its RFC 7638 thumbprint, so that the bench tokens are bound to it (DPoP-bound: a proof per request).
    DPOP_JKT=$("$BENCH_DIR/dpop_key.py" "$DPOP" "$TMP/dpop.pem") || die "DPOP must be ES256, ES384, EdDSA, RS256 or PS256"
    chmod 0644 "$TMP/dpop.pem"
    DPOP_JSON="\"dpop\": { \"alg\": \"$DPOP\", \"key_file\": \"$TMP/dpop.pem\" },"
    printf '{"access_token":"%s","refresh_token":"bench-refresh-123456","dpop_jkt":"%s"}\n' "$TOKEN" "$DPOP_JKT" >"$TMP/tokens.json"
else
printf '{"access_token":"%s","refresh_token":"bench-refresh-123456"}\n' "$TOKEN" >"$TMP/tokens.json"
fi
chmod 0600 "$TMP/tokens.json"
routes_json() { # ROUTES prefix routes to the same upstream
    [[ "$ROUTES" -gt 0 ]] || return 0
    printf '"routes": ['
    for ((i = 0; i < ROUTES; i++)); do
        ((i == 0)) || printf ','
        printf '{"name":"r%d","match":{"path_prefix":"/route-%d/"},"upstream":{"url":"http://127.0.0.1:%s"}}' "$i" "$i" "$UP_PORT"
    done
    printf '],'
}
tokenrelay_conf() { # port admin-port token-file engine
    cat <<EOF
{ "listen": "127.0.0.1:$1",
  "data_plane": "$4",
  "upstream": $(if [[ "$UPSTREAM_TLS" == 1 ]]; then
      echo "{ \"url\": \"https://127.0.0.1:$UP_TLS_PORT\", \"tls\": { \"ca_file\": \"$TMP/tls/ca.pem\", \"server_name\": \"localhost\" } },"
  else
      echo "{ \"url\": \"http://127.0.0.1:$UP_PORT\" },"
  fi)
  "tokens": { "file": "$3" },
  "refresh": { "grant": "refresh_token", "token_url": "http://127.0.0.1:9/oauth/token", "client_id": "bench", "client_auth": "none" },
  "admin": { "listen": "127.0.0.1:$2" },
  $DPOP_JSON
  $(routes_json)
  "limits": { "max_client_connections": 20000 } }
EOF
}
# Every instance has its own token file (the file is its state; instances must not share it).
for e in "${ENGINES[@]}"; do
    for d in "tr-$e" "cgtr-$e"; do
        mkdir -p "$TMP/$d"
        cp "$TMP/tokens.json" "$TMP/$d/tokens.json"
        chmod 0600 "$TMP/$d/tokens.json"
    done
    tokenrelay_conf "${TR_PORT_OF[$e]}" "${TR_ADMIN_PORT_OF[$e]}" "$TMP/tr-$e/tokens.json" "$e" >"$TMP/tr-$e/tokenrelay.json"
    tokenrelay_conf "${CG_TR_PORT_OF[$e]}" "${CG_TR_ADMIN_PORT_OF[$e]}" "$TMP/cgtr-$e/tokens.json" "$e" >"$TMP/cgtr-$e/tokenrelay.json"
done

# ---------------------------------------------------------------- helpers
wait_port() { # port seconds
    local i
    for i in $(seq 1 $(($2 * 20))); do
        [[ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]] && return 0
        sleep 0.05
    done
    return 1
}
nginx_worker() { # master pid -> worker pid
    local w i
    for i in $(seq 1 100); do
        w=$(pgrep -P "$1" | head -n 1 || true)
        [[ -n "$w" ]] && { echo "$w"; return 0; }
        sleep 0.05
    done
    return 1
}
wait_log() { # file pattern pid seconds
    local i
    for i in $(seq 1 $(($4 * 20))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }   # utime+stime
# TCP segments sent machine-wide (all of 127.0.0.1 here), and of them pure ACKs: how much packet work each
# proxy's socket behaviour causes (every segment on loopback is processed by the kernel twice, out and in).
# Inter-processor interrupts machine-wide (rescheduling + function call, all CPUs): a wake-up of a task on the
# other, idle CPU is one, and in this VM the vCPU it wakes has halted (no idle polling), which the sender pays
# for inside the kernel. A proxy that is the run's bottleneck wakes idle peers (wrk, the upstream) more often.
ipis() { awk '$1 == "RES:" || $1 == "CAL:" {for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i} END {print n + 0}' /proc/interrupts; }
irq_counts() { awk '$1 ~ /^(RES|CAL|TLB|LOC):$/ {print $1, $2, $3}' /proc/interrupts; }   # kind, CPU 0, CPU 1
tcp_segments() { nstat -az TcpOutSegs TcpExtTCPPureAcks 2>/dev/null | awk '$1 == "TcpOutSegs" {o = $2} $1 == "TcpExtTCPPureAcks" {a = $2} END {print o + 0, a + 0}'; }
sys_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $13}'; }         # stime alone (the kernel's share)
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# "anon A file F" (KiB): the heap and other anonymous pages, and the mapped pages of the binary and libraries.
rss_split() { awk '/^RssAnon:/ {a = $2} /^RssFile:/ {f = $2} END {printf "anon %.1fM file %.1fM", a / 1024, f / 1024}' "/proc/$1/status"; }
declare -A RSS_SPLIT_AFTER RSS_SPLIT_IDLE_CLIENTS
alive() { kill -0 "$1" 2>/dev/null; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else printf "%.4g\n", (a[NR/2]+a[NR/2+1])/2}'; }
to_ms() { # wrk latency ("812.00us", "1.20ms", "2.01s") -> ms
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}
wrk_count() { # url connections count -> wrk output (stops after COUNT responses)
    local marker=$TMP/count.done w
    rm -f "$marker"
    COUNT=$3 MARKER=$marker "${LOAD_CPU[@]}" wrk -t1 -c"$2" -d600s -s "$TMP/count.lua" "$1" >"$TMP/count.out" 2>&1 &
    w=$!
    for _ in $(seq 1 12000); do
        [[ -e "$marker" ]] && break
        kill -0 "$w" 2>/dev/null || break
        sleep 0.05
    done
    kill -INT "$w" 2>/dev/null || true
    wait "$w" 2>/dev/null || true
    cat "$TMP/count.out"
}
requests_of() { awk '/requests in/ {print $1; exit}' <<<"$1"; }
# RATE=N: the measured run offers N requests/s in all (h2load --h1, --rps per connection) instead of wrk's
# closed loop, the same to every proxy, so that neither is the run's bottleneck; prints wrk's summary lines
# (requests, req/s, 50%/99% from h2load's per-request log, errors) for the parsing below.
rate_run() { # url connections
    local out
    out=$("${LOAD_CPU[@]}" h2load --h1 -t1 -c"$2" --rps="$(( (RATE + $2 - 1) / $2 ))" -D "$DURATION" --log-file="$TMP/rate.tsv" "$1" 2>&1) || true
    awk -v d="$DURATION" '/^requests:/ {printf "%d requests in %ss\n", $8, d; printf "Socket errors: connect 0, read 0, write 0, timeout %d\n", $10 + $12 + $14}
        /^finished in/ {gsub(",", "", $4); printf "Requests/sec: %s\n", $4}
        /^status codes:/ {printf "Non-2xx or 3xx responses: %d\n", $7 + $9}' <<<"$out"
    awk '{print $3}' "$TMP/rate.tsv" | sort -n | awk '{v[NR] = $1} END {if (NR == 0) exit; i = int(NR * 0.5); if (i < 1) i = 1; j = int(NR * 0.99); if (j < 1) j = 1; printf "50%% %.2fus\n99%% %.2fus\n", v[i], v[j]}'
}
# Upstream TLS connections so far and how many of them resumed a session: "total resumed".
tls_connections() {
    if [[ -f "$TMP/up/tls-connections.log" ]]; then
        awk '{n++} $1 == "r" {r++} END {printf "%d %d\n", n, r}' "$TMP/up/tls-connections.log"
    else
        echo "0 0"
    fi
}

# ---------------------------------------------------------------- start
log "starting upstream nginx on 127.0.0.1:$UP_PORT"
"${LOAD_CPU[@]}" "$NGINX" -p "$TMP/up/" -e "$TMP/up/error.log" -c "$TMP/up/nginx.conf" &
PIDS+=($!)
wait_port "$UP_PORT" 5 || { cat "$TMP/up/error.log" >&2; die "upstream nginx did not start"; }
if [[ "$UPSTREAM_TLS" == 1 ]]; then wait_port "$UP_TLS_PORT" 5 || die "upstream nginx not listening on $UP_TLS_PORT (TLS)"; fi

log "starting nginx reverse proxy on 127.0.0.1:$NGX_PORT"
"${PROXY_CPU[@]}" "$NGINX" -p "$TMP/ngx/" -e "$TMP/ngx/error.log" -c "$TMP/ngx/nginx.conf" &
NGX_MASTER=$!
PIDS+=("$NGX_MASTER")
wait_port "$NGX_PORT" 5 || { cat "$TMP/ngx/error.log" >&2; die "nginx proxy did not start"; }
NGX_PID=$(nginx_worker "$NGX_MASTER") || die "nginx proxy worker not found"

PROXIES=(nginx)
declare -A PID_OF=([nginx]=$NGX_PID)
declare -A PORT_OF=([nginx]=$NGX_PORT)
declare -A LOG_OF=()
for e in "${ENGINES[@]}"; do
    log "starting tokenrelay (data_plane: $e) on 127.0.0.1:${TR_PORT_OF[$e]}"
    LOG_OF[$e]=$RESULTS_DIR/latest-tokenrelay-$e.log
    "${PROXY_CPU[@]}" "${BIN_OF[$e]}" run --config "$TMP/tr-$e/tokenrelay.json" 2>"${LOG_OF[$e]}" &
    PID_OF[$e]=$!
    PIDS+=("${PID_OF[$e]}")
    wait_log "${LOG_OF[$e]}" 'msg=listening' "${PID_OF[$e]}" 10 || { cat "${LOG_OF[$e]}" >&2; die "tokenrelay ($e) did not start"; }
    wait_port "${TR_PORT_OF[$e]}" 5 || die "tokenrelay ($e) not listening on ${TR_PORT_OF[$e]}"
    PORT_OF[$e]=${TR_PORT_OF[$e]}
    PROXIES+=("$e")
done
if [[ "$BENCH_RELAY" == 1 ]]; then
    log "starting transport-bench-relay on 127.0.0.1:$RL_PORT"
    "${PROXY_CPU[@]}" "$RELAY_BIN" "$RL_PORT" "$UP_PORT" "$TOKEN" 2>"$RESULTS_DIR/latest-relay.log" &
    PID_OF[relay]=$!
    PIDS+=("${PID_OF[relay]}")
    wait_port "$RL_PORT" 10 || { cat "$RESULTS_DIR/latest-relay.log" >&2; die "transport-bench-relay did not start"; }
    PROXIES+=(relay)
    PORT_OF[relay]=$RL_PORT
fi
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A RSS_IDLE RSS_AFTER
for p in "${PROXIES[@]}"; do RSS_IDLE[$p]=$(rss_kb "${PID_OF[$p]}"); done

# ---------------------------------------------------------------- sanity
for p in "${PROXIES[@]}"; do
    port=${PORT_OF[$p]}
    got=$(curl -sS --max-time 5 "http://127.0.0.1:$port/check") || die "$p: /check failed"
    want="Bearer $TOKEN"
    # With DPOP tokenrelay's tokens are DPoP-bound (nginx stays bearer).
    if [[ -n "$DPOP" && "$p" != nginx ]]; then want="DPoP $TOKEN"; fi
    [[ "$got" == "$want" ]] || die "$p: upstream saw Authorization '$got'"
    got=$(curl -sS --max-time 5 "http://127.0.0.1:$port/small") || die "$p: /small failed"
    [[ "$got" == "$SMALL_BODY" ]] || die "$p: /small returned '$got'"
    got=$(curl -sS --max-time 10 "http://127.0.0.1:$port/large" | sha256sum | cut -d' ' -f1)
    [[ "$got" == "$LARGE_SHA" ]] || die "$p: /large body differs from the upstream file"
done
log "sanity check passed (token injected, bodies intact through both proxies)"

declare -A CONN_OF=([small]=$CONNECTIONS [large]=$LARGE_CONNECTIONS)
declare -A COUNT_OF=([small]=$COUNT_SMALL [large]=$COUNT_LARGE)
declare -A CG_COUNT_OF=([small]=$CG_SMALL [large]=$CG_LARGE)

# ---------------------------------------------------------------- 1. system calls per request (strace -c)
# Deterministic, so the figure to compare first. strace attaches to every thread of the process (-f -p);
# nginx: its worker. Each proxy is warmed first so its upstream keep-alive pool exists.
declare -A SYS_TOTAL SYS_TOP
for s in "${SCENARIOS[@]}"; do
    for p in "${PROXIES[@]}"; do
        pid=${PID_OF[$p]}
        url="http://127.0.0.1:${PORT_OF[$p]}/$s"
        wrk_count "$url" 8 200 >/dev/null
        out_file=$TMP/strace-$p-$s.txt
        strace -c -f -q -o "$out_file" -p "$pid" &
        st_pid=$!
        for _ in $(seq 1 100); do
            [[ "$(awk '/^TracerPid:/ {print $2}' "/proc/$pid/status")" != 0 ]] && break
            sleep 0.05
        done
        out=$(wrk_count "$url" 8 "${COUNT_OF[$s]}")
        kill -INT "$st_pid" 2>/dev/null || true
        wait "$st_pid" 2>/dev/null || true
        n=$(requests_of "$out")
        [[ -n "$n" && "$n" -gt 0 ]] || die "$p / $s: no requests completed under strace"
        # strace -c columns: % time, seconds, usecs/call, calls, [errors], syscall; "total" last.
        SYS_TOTAL[$p.$s]=$(awk -v n="$n" '$NF == "total" {printf "%.1f", $4 / n}' "$out_file")
        SYS_TOP[$p.$s]=$(awk -v n="$n" '$1 ~ /^[0-9.]+$/ && $NF != "total" && NF >= 5 {printf "%s %.2f\n", $NF, $4 / n}' "$out_file" \
            | sort -k2 -g -r | awk '$2 >= 0.05 {printf "%s%s %s", sep, $2, $1; sep=", "}')
        cp "$out_file" "$RESULTS_DIR/strace-$p-$s.txt"
        log "$p / $s: ${SYS_TOTAL[$p.$s]} syscalls per request over $n requests"
    done
done

# ---------------------------------------------------------------- 2. timed rounds, interleaved
RAW=$RESULTS_DIR/latest-wrk.txt
: >"$RAW"
declare -A V_RPS V_P50 V_P99 V_CPU V_SYSCPU V_SEGS V_ACKS V_ERR V_HS V_RESUMED V_IPI
for r in $(seq 1 "$ROUNDS"); do
    order=("${PROXIES[@]}")
    if ! ((r % 2)); then for ((i = 0; i < ${#PROXIES[@]}; i++)); do order[i]=${PROXIES[${#PROXIES[@]} - 1 - i]}; done; fi
    for s in "${SCENARIOS[@]}"; do
        for p in "${order[@]}"; do
            pid=${PID_OF[$p]}
            url="http://127.0.0.1:${PORT_OF[$p]}/$s"
            c=${CONN_OF[$s]}
            log "round $r: $p / $s: warm-up ${WARMUP}s, wrk -t1 -c$c -d${DURATION}s"
            "${LOAD_CPU[@]}" wrk -t1 -c"$c" -d"${WARMUP}s" "$url" >/dev/null 2>&1 || true
            alive "$pid" || die "$p (pid $pid) died during warm-up"
            read -r h0 hr0 < <(tls_connections)
            read -r g0 a0 < <(tcp_segments)
            t0=$(cpu_ticks "$pid"); k0=$(sys_ticks "$pid"); i0=$(ipis); irq0=$(irq_counts)
            if [[ -n "$RATE" ]]; then out=$(rate_run "$url" "$c"); else
            out=$("${LOAD_CPU[@]}" wrk -t1 -c"$c" -d"${DURATION}s" --latency "$url" 2>&1) || true; fi
            t1=$(cpu_ticks "$pid") || die "$p (pid $pid) died during the run"
            k1=$(sys_ticks "$pid"); i1=$(ipis); irq1=$(irq_counts)
            read -r g1 a1 < <(tcp_segments)
            read -r h1 hr1 < <(tls_connections)
            printf '===== round %s %s / %s: wrk -t1 -c%s -d%ss --latency %s\n%s\n\n' "$r" "$p" "$s" "$c" "$DURATION" "$url" "$out" >>"$RAW"
            req=$(requests_of "$out")
            # Interrupts by kind and CPU over the run, per request (the raw file only: which kind the IPIs/req column counts).
            paste <(echo "$irq0") <(echo "$irq1") | awk -v n="${req:-0}" -v p="$p" 'n > 0 {printf "interrupts/req %s %s cpu0 %.3f cpu1 %.3f\n", p, $1, ($5 - $2) / n, ($6 - $3) / n}' >>"$RAW"
            [[ -n "$req" && "$req" -gt 0 ]] || { echo "$out" >&2; die "$p / $s: wrk made no requests"; }
            V_RPS[$p.$s]+=" $(awk '/^Requests\/sec:/ {printf "%.0f", $2; exit}' <<<"$out")"
            V_P50[$p.$s]+=" $(to_ms "$(awk '$1 == "50%" {print $2; exit}' <<<"$out")")"
            V_P99[$p.$s]+=" $(to_ms "$(awk '$1 == "99%" {print $2; exit}' <<<"$out")")"
            V_CPU[$p.$s]+=" $(awk -v d="$((t1 - t0))" -v hz="$CLK_TCK" -v n="$req" 'BEGIN {printf "%.1f", d / hz * 1e6 / n}')"
            V_SEGS[$p.$s]+=" $(awk -v d="$((g1 - g0))" -v n="$req" 'BEGIN {printf "%.2f", d / n}')"
            V_ACKS[$p.$s]+=" $(awk -v d="$((a1 - a0))" -v n="$req" 'BEGIN {printf "%.2f", d / n}')"
            V_IPI[$p.$s]+=" $(awk -v d="$((i1 - i0))" -v n="$req" 'BEGIN {printf "%.2f", d / n}')"
            V_SYSCPU[$p.$s]+=" $(awk -v d="$((k1 - k0))" -v hz="$CLK_TCK" -v n="$req" 'BEGIN {printf "%.1f", d / hz * 1e6 / n}')"
            V_HS[$p.$s]+=" $(awk -v h="$((h1 - h0))" -v n="$req" 'BEGIN {printf "%.2f", h * 1000 / n}')"
            V_RESUMED[$p.$s]+=" $(awk -v h="$((h1 - h0))" -v r="$((hr1 - hr0))" 'BEGIN {if (h == 0) print "-"; else printf "%.0f", r * 100 / h}')"
            non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF; exit}' <<<"$out")
            sockerr=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10; exit}' <<<"$out")
            V_ERR[$p.$s]=$(( ${V_ERR[$p.$s]:-0} + ${non2xx:-0} + ${sockerr:-0} ))
        done
    done
done
for p in "${PROXIES[@]}"; do RSS_AFTER[$p]=$(rss_kb "${PID_OF[$p]}"); RSS_SPLIT_AFTER[$p]=$(rss_split "${PID_OF[$p]}"); done

# ---------------------------------------------------------------- 3. user-space instructions (callgrind)
# A second instance of each proxy runs under callgrind; its counters are zeroed before and dumped after a
# fixed number of requests, so start-up is not counted. Every user-space instruction of the process counts
# (libevent, libc, the Swift runtime, nginx's own code).
declare -A INSN
if [[ "$CALLGRIND" == 1 ]]; then
    log "starting nginx and tokenrelay under callgrind (slow)"
    "${PROXY_CPU[@]}" valgrind -q --tool=callgrind --callgrind-out-file="$TMP/cg/nginx.out" \
        "$NGINX" -p "$TMP/cgngx/" -e "$TMP/cgngx/error.log" -c "$TMP/cgngx/nginx.conf" 2>"$TMP/cg/nginx.err" &
    declare -A CG_PID_OF=([nginx]=$!)
    declare -A CG_PORT_OF=([nginx]=$CG_NGX_PORT)
    PIDS+=("${CG_PID_OF[nginx]}")
    # valgrind 3.19 cannot read the DWARF 5 debug info of Swift's static runtime: count on a copy without it
    # (the symbol table stays, so function names do too).
    for e in "${ENGINES[@]}"; do
        objcopy --strip-debug "${BIN_OF[$e]}" "$TMP/cg/tokenrelay-$e"
        "${PROXY_CPU[@]}" valgrind -q --tool=callgrind --callgrind-out-file="$TMP/cg/$e.out" \
            "$TMP/cg/tokenrelay-$e" run --config "$TMP/cgtr-$e/tokenrelay.json" 2>"$TMP/cg/$e.err" &
        CG_PID_OF[$e]=$!
        CG_PORT_OF[$e]=${CG_TR_PORT_OF[$e]}
        PIDS+=("${CG_PID_OF[$e]}")
    done
    if [[ "$BENCH_RELAY" == 1 ]]; then
        "${PROXY_CPU[@]}" valgrind -q --tool=callgrind --callgrind-out-file="$TMP/cg/relay.out" \
            "$RELAY_BIN" "$CG_RL_PORT" "$UP_PORT" "$TOKEN" 2>"$TMP/cg/relay.err" &
        CG_PID_OF[relay]=$!
        PIDS+=("${CG_PID_OF[relay]}")
        CG_PORT_OF[relay]=$CG_RL_PORT
    fi
    for p in "${PROXIES[@]}"; do
        if [[ "$p" == nginx || "$p" == relay ]]; then
            wait_port "${CG_PORT_OF[$p]}" 120 || { cat "$TMP/cg/$p.err" >&2; die "$p under callgrind did not start"; }
        else
            wait_log "$TMP/cg/$p.err" 'msg=listening' "${CG_PID_OF[$p]}" 180 || { cat "$TMP/cg/$p.err" >&2; die "tokenrelay ($p) under callgrind did not start"; }
        fi
    done
    for s in "${SCENARIOS[@]}"; do
        for p in "${PROXIES[@]}"; do
            pid=${CG_PID_OF[$p]}
            url="http://127.0.0.1:${CG_PORT_OF[$p]}/$s"
            wrk_count "$url" 4 20 >/dev/null
            callgrind_control -z "$pid" >/dev/null 2>&1
            out=$(wrk_count "$url" 4 "${CG_COUNT_OF[$s]}")
            rm -f "$TMP/cg/$p.out".*
            callgrind_control -d "$pid" >/dev/null 2>&1
            n=$(requests_of "$out")
            dump=$(ls -t "$TMP/cg/$p.out".* 2>/dev/null | head -n 1)
            [[ -n "$dump" && -n "$n" && "$n" -gt 0 ]] || die "$p / $s: callgrind produced no dump"
            INSN[$p.$s]=$(awk -v n="$n" '/^(summary|totals):/ {printf "%.0f", $2 / n; exit}' "$dump")
            if [[ "$CG_KEEP" == 1 ]]; then cp "$dump" "$RESULTS_DIR/callgrind-$p-$s.out"; fi
            log "$p / $s: ${INSN[$p.$s]} user-space instructions per request over $n requests"
        done
    done
    for p in "${PROXIES[@]}"; do stop_pid "${CG_PID_OF[$p]}"; done
fi

# ---------------------------------------------------------------- 4. RSS with idle clients
# IDLE_CLIENTS connections opened to each proxy and left silent (as keep-alive clients between
# requests are), then the proxy's RSS; the connections are closed before the next proxy.
declare -A RSS_IDLE_CLIENTS
if ((IDLE_CLIENTS > 0)); then
    cat >"$TMP/idle.py" <<'EOF'
import resource, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
EOF
    for p in "${PROXIES[@]}"; do
        pid=${PID_OF[$p]}
        log "$p: opening $IDLE_CLIENTS idle connections"
        coproc IDLE { "${LOAD_CPU[@]}" python3 "$TMP/idle.py" "${PORT_OF[$p]}" "$IDLE_CLIENTS" 2>&1; }
        IDLE_HOLDER=$IDLE_PID
        opened=""
        read -r -t 120 opened <&"${IDLE[0]}" || true
        if [[ "$opened" == "$IDLE_CLIENTS" ]]; then
            # The proxy accepts asynchronously: poll (bounded) until its RSS stops growing.
            prev=0
            for _ in $(seq 1 50); do
                cur=$(rss_kb "$pid")
                ((cur == prev)) && break
                prev=$cur
                sleep 0.2
            done
            RSS_IDLE_CLIENTS[$p]=$(rss_kb "$pid")
            RSS_SPLIT_IDLE_CLIENTS[$p]=$(rss_split "$pid")
        else
            log "WARNING: $p: could not hold $IDLE_CLIENTS connections (${opened:-none})"
            RSS_IDLE_CLIENTS[$p]=""
        fi
        eval "exec ${IDLE[1]}>&-"
        wait "$IDLE_HOLDER" 2>/dev/null || true
        alive "$pid" || die "$p (pid $pid) died with $IDLE_CLIENTS idle clients"
    done
fi

# ---------------------------------------------------------------- report
mb() { awk -v k="$1" 'BEGIN {printf "%.1fM", k / 1024}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "x%.2f", a / b }'; }
REPORT=$RESULTS_DIR/latest.txt
{
    echo "tokenrelay (evhttp = data_plane evhttp, transport = data_plane transport) vs nginx reverse proxy  ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $LOADAVG_START, $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo '?'), tokenrelay Swift runtime: $STDLIB)"
    echo "small = /small, 100-byte body, wrk -t1 -c$CONNECTIONS; large = /large, $LARGE_BYTES-byte body, wrk -t1 -c$LARGE_CONNECTIONS"
    echo "timed: medians of $ROUNDS interleaved rounds of ${DURATION}s; pinned: ${PROXY_CPU[*]:-no}"
    echo "syscalls/req: strace -c -f over $COUNT_SMALL (small) / $COUNT_LARGE (large) requests, c=8"
    echo "insn/req: callgrind Ir (user space, whole process) over $CG_SMALL / $CG_LARGE requests, c=4"
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        echo "upstream over TLS (nginx listen ssl, private CA); upstream keepalive_requests $UPSTREAM_KEEPALIVE_REQUESTS;" \
            "evhttp binary: ${BIN_OF[evhttp]}"
    elif [[ "$UPSTREAM_KEEPALIVE_REQUESTS" != 1000000 ]]; then
        echo "upstream keepalive_requests $UPSTREAM_KEEPALIVE_REQUESTS"
    fi
    echo
    printf '%-6s %-11s %10s %9s %9s %11s %12s %12s %7s\n' path proxy req/s p50ms p99ms 'CPU us/req' 'syscalls/req' 'insn/req' errors
    for s in "${SCENARIOS[@]}"; do
        for p in "${PROXIES[@]}"; do
            printf '%-6s %-11s %10s %9s %9s %11s %12s %12s %7s\n' "$s" "$p" \
                "$(median <<<"${V_RPS[$p.$s]}")" "$(median <<<"${V_P50[$p.$s]}")" "$(median <<<"${V_P99[$p.$s]}")" \
                "$(median <<<"${V_CPU[$p.$s]}")" "${SYS_TOTAL[$p.$s]}" "${INSN[$p.$s]:--}" "${V_ERR[$p.$s]}"
        done
    done
    echo
    for s in "${SCENARIOS[@]}"; do
        for p in "${PROXIES[@]}"; do
            [[ "$p" == nginx ]] && continue
            printf '%-6s %s/nginx: syscalls %s, insn %s, CPU %s, req/s %s, p99 %s\n' "$s" "$p" \
                "$(ratio "${SYS_TOTAL[$p.$s]}" "${SYS_TOTAL[nginx.$s]}")" \
                "$(ratio "${INSN[$p.$s]:--}" "${INSN[nginx.$s]:--}")" \
                "$(ratio "$(median <<<"${V_CPU[$p.$s]}")" "$(median <<<"${V_CPU[nginx.$s]}")")" \
                "$(ratio "$(median <<<"${V_RPS[$p.$s]}")" "$(median <<<"${V_RPS[nginx.$s]}")")" \
                "$(ratio "$(median <<<"${V_P99[$p.$s]}")" "$(median <<<"${V_P99[nginx.$s]}")")"
        done
    done
    echo
    echo "timed figures, every round (how noisy the medians above are):"
    for s in "${SCENARIOS[@]}"; do
        for p in "${PROXIES[@]}"; do
            printf '  %-6s %-11s req/s%s | p99 ms%s | CPU us/req%s | of it kernel%s | TCP segments/req%s, pure ACKs%s | IPIs/req%s\n' "$s" "$p" "${V_RPS[$p.$s]}" "${V_P99[$p.$s]}" "${V_CPU[$p.$s]}" "${V_SYSCPU[$p.$s]}" "${V_SEGS[$p.$s]}" "${V_ACKS[$p.$s]}" "${V_IPI[$p.$s]:-}"
        done
    done
    echo
    echo "RSS      idle       after load   with $IDLE_CLIENTS idle clients   (nginx: worker only)"
    for p in "${PROXIES[@]}"; do
        idle_clients=${RSS_IDLE_CLIENTS[$p]:-}
        printf '%-11s %-10s %-12s %s\n' "$p" "$(mb "${RSS_IDLE[$p]}")" "$(mb "${RSS_AFTER[$p]}")" \
            "$([[ -n "$idle_clients" ]] && mb "$idle_clients" || echo -)"
    done
    for p in "${PROXIES[@]}"; do
        printf '  %-11s after load: %s; with idle clients: %s\n' "$p" "${RSS_SPLIT_AFTER[$p]}" "${RSS_SPLIT_IDLE_CLIENTS[$p]:--}"
    done
    echo
    echo "system calls per request by name (>= 0.05):"
    for s in "${SCENARIOS[@]}"; do
        for p in "${PROXIES[@]}"; do
            printf '  %-6s %-11s %s\n' "$s" "$p" "${SYS_TOP[$p.$s]}"
        done
    done
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        echo "upstream TLS handshakes per 1,000 requests | % of them resumed, every timed round:"
        for s in "${SCENARIOS[@]}"; do
            for p in "${PROXIES[@]}"; do
                printf '  %-6s %-11s%s |%s\n' "$s" "$p" "${V_HS[$p.$s]}" "${V_RESUMED[$p.$s]}"
            done
        done
    fi
    echo "errors = wrk non-2xx/3xx responses + socket errors over all timed rounds; raw: bench/results/latest-wrk.txt"
    if [[ -n "$DPOP" ]]; then
        # One signature's cost on this machine now (openssl's own loop, one core), beside the proxies' figures.
        # The sign/s column of its table row (RS256 and PS256: the RSA-2048 private-key operation either padding costs).
        speed_alg=$("$BENCH_DIR/dpop_key.py" --speed "$DPOP")
        sig_per_s=$(openssl speed -seconds 1 "$speed_alg" 2>/dev/null | awk -v a="$speed_alg" '
            a == "ecdsap256" && $1 == "256" && $3 == "ecdsa" {print $(NF-1)}
            a == "ecdsap384" && $1 == "384" && $3 == "ecdsa" {print $(NF-1)}
            a == "rsa2048" && $1 == "rsa" && $2 == "2048" {print $(NF-1)}
            a == "ed25519" && $3 == "EdDSA" {print $(NF-1)}' | head -n 1)
        sig_us=$(awk -v r="${sig_per_s:-0}" 'BEGIN { if (r > 0) printf "%.1f", 1e6 / r; else print "-" }')
        nginx_cpu=$(median <<<"${V_CPU[nginx.small]:-}")
        tr_cpu=$(median <<<"${V_CPU[transport.small]:-}")
        echo "DPoP $DPOP: tokenrelay signs a proof per request (jkt $DPOP_JKT); openssl speed $speed_alg: ${sig_per_s:-?} sign/s = $sig_us us/signature"
        awk -v t="$tr_cpu" -v n="$nginx_cpu" -v s="$sig_us" 'BEGIN { if (s == "-" || t == "" || n == "") exit;
            printf "goal /small CPU <= nginx + 1.3 x signature: %.1f <= %.1f + %.1f = %.1f us/req: %s (tokenrelay - nginx = %.2f signatures)\n", t, n, 1.3 * s, n + 1.3 * s, (t <= n + 1.3 * s ? "met" : "NOT met"), (t - n) / s }'
        # Where the difference is: user space (ours: the proof and the signature) and the kernel (medians of the rounds).
        awk -v t="$tr_cpu" -v n="$nginx_cpu" -v tk="$(median <<<"${V_SYSCPU[transport.small]:-}")" -v nk="$(median <<<"${V_SYSCPU[nginx.small]:-}")" \
            -v s="$sig_us" -v ti="$(median <<<"${V_IPI[transport.small]:-}")" -v ni="$(median <<<"${V_IPI[nginx.small]:-}")" 'BEGIN {
            if (s == "-" || t == "" || n == "" || tk == "-" || nk == "-") exit;
            printf "  of it user space: tokenrelay %.1f, nginx %.1f us/req (%.2f signatures apart); kernel: %.1f, %.1f (%.2f); IPIs/req %s, %s\n", t - tk, n - nk, ((t - tk) - (n - nk)) / s, tk, nk, (tk - nk) / s, ti, ni }'
        p99_tr=$(median <<<"${V_P99[transport.small]:-}"); p99_ngx=$(median <<<"${V_P99[nginx.small]:-}")
        awk -v t="$p99_tr" -v n="$p99_ngx" 'BEGIN { if (t == "-" || n == "-" || n + 0 == 0) exit;
            printf "goal /small p99 <= 1.3 x nginx: %.2f <= 1.3 x %.2f = %.2f ms: %s (x%.2f)\n", t, n, 1.3 * n, (t <= 1.3 * n ? "met" : "NOT met"), t / n }'
    fi
} | tee "$RESULTS_DIR/latest.txt"

for e in "${ENGINES[@]}"; do
    if grep -qiE 'level=(error|warn|critical)' "${LOG_OF[$e]}"; then
        log "tokenrelay ($e) logged warnings/errors:"
        grep -iE 'level=(error|warn|critical)' "${LOG_OF[$e]}" | sort | uniq -c | sort -rn | head -n 10 >&2
    fi
done

# ---------------------------------------------------------------- perf (optional)
if [[ "$PERF" == 1 ]]; then
    if ! command -v perf >/dev/null 2>&1; then
        log "PERF=1 but perf is not installed (apt-get install linux-perf)"
    else
        set +e +o pipefail   # head closing pipes must not abort the script here
        PERF_OUT=$RESULTS_DIR/perf-latest.txt
        PERF_DATA=$RESULTS_DIR/perf-latest.data
        log "profiling tokenrelay (transport) with perf during a ${DURATION}s /small run"
        perf record -q -F 999 -g -p "${PID_OF[transport]}" -o "$PERF_DATA" -- sleep "$((DURATION + 1))" \
            >/dev/null 2>"$TMP/perf.err" &
        PERF_PID=$!
        sleep 0.5
        "${LOAD_CPU[@]}" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:${PORT_OF[transport]}/small" >/dev/null 2>&1 || true
        wait "$PERF_PID" || { cat "$TMP/perf.err" >&2; log "perf record failed"; }
        if [[ -s "$PERF_DATA" ]]; then
            demangle() { if command -v swift-demangle >/dev/null 2>&1; then swift-demangle --simplified; else cat; fi; }
            tidy() { grep -v '^#' | grep -v '^$' | sed -e 's/[ -]*$//' | head -n "$1" | demangle; }
            {
                echo "perf: tokenrelay, /small, c=$CONNECTIONS, ${DURATION}s"
                echo "--- self (top 25 symbols) ---"
                perf report -i "$PERF_DATA" --no-children --sort symbol --stdio -g none --percent-limit 0.3 2>/dev/null | tidy 25
                echo "--- inclusive / children (top 40 symbols) ---"
                perf report -i "$PERF_DATA" --children --sort symbol --stdio -g none --percent-limit 1 2>/dev/null | tidy 40
                echo "--- by DSO ---"
                perf report -i "$PERF_DATA" --no-children --sort dso --stdio -g none 2>/dev/null | tidy 15
            } >"$PERF_OUT"
            cat "$PERF_OUT"
            log "perf data kept in $PERF_DATA (perf report -i ... --children)"
        fi
        set -e -o pipefail
    fi
fi

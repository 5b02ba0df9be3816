#!/usr/bin/env bash
# Benchmark tokenrelay against nginx as a reverse proxy, on 127.0.0.1 only.
#
#   bench/run.sh                      # defaults: DURATION=10 CONNECTIONS=32
#   DURATION=5 CONNECTIONS=64 bench/run.sh
#
# Knobs (environment):
#   DURATION         seconds per measured wrk run             (default 10)
#   WARMUP           seconds of warm-up before each run        (default 2)
#   CONNECTIONS      wrk connections, small-response scenario  (default 32)
#   BIG_CONNECTIONS  wrk connections, 1 MiB scenario           (default 8)
#   BASE_PORT        first of 4 consecutive 127.0.0.1 ports    (default 18590)
#   SKIP_BUILD=1     use the existing .build-bench/release/tokenrelay as is
#   PERF=1           after the measurements, profile tokenrelay with
#                    `perf record -g` during one more small-response run and
#                    write the top symbols to bench/results/perf-latest.txt
#
# See bench/README.md for what is measured and how to read the output.
set -euo pipefail

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-32}
BIG_CONNECTIONS=${BIG_CONNECTIONS:-8}
BASE_PORT=${BASE_PORT:-18590}
SKIP_BUILD=${SKIP_BUILD:-0}
PERF=${PERF:-0}

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
RESULTS_DIR=$BENCH_DIR/results
SCRATCH=$REPO_DIR/.build-bench
BIN=$SCRATCH/release/tokenrelay

UP_PORT=$BASE_PORT               # upstream nginx
NGX_PORT=$((BASE_PORT + 1))      # nginx reverse proxy
TR_PORT=$((BASE_PORT + 2))       # tokenrelay proxy
TR_ADMIN_PORT=$((BASE_PORT + 3)) # tokenrelay admin
TOKEN=bench-token-123456

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- cleanup
PIDS=()
TMP=""
cleanup() {
    local rc=$?
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n "$TMP" && -d "$TMP" ]]; then
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- deps
need_pkgs=()
command -v wrk >/dev/null 2>&1 || need_pkgs+=(wrk)
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || need_pkgs+=(nginx-light)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
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
    # The distro package may start a system nginx on :80; we never use it,
    # but don't leave one running that we caused (only if it is ours to stop).
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx not found"
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------- build
if [[ "$SKIP_BUILD" != 1 || ! -x "$BIN" ]]; then
    log "building tokenrelay (release, scratch path .build-bench)"
    (cd "$REPO_DIR" && swift build -c release --scratch-path "$SCRATCH" --product tokenrelay 2>&1 | tail -n 3) >&2
fi
[[ -x "$BIN" ]] || die "tokenrelay binary missing: $BIN"

# ---------------------------------------------------------------- ports
for p in "$UP_PORT" "$NGX_PORT" "$TR_PORT" "$TR_ADMIN_PORT"; do
    if [[ -n "$(ss -Htln "sport = :$p" 2>/dev/null)" ]]; then
        die "port $p is in use; pick another range with BASE_PORT=..."
    fi
done

# ---------------------------------------------------------------- temp dir
mkdir -p "$RESULTS_DIR"
TR_LOG=$RESULTS_DIR/latest-tokenrelay.log   # kept after the run for diagnosis
TMP=$(mktemp -d /tmp/tokenrelay-bench.XXXXXX)
# nginx workers started by root run as 'nobody' and must read /big.
chmod 0755 "$TMP"
mkdir -p "$TMP/www" "$TMP/up" "$TMP/ngx"
head -c 1048576 /dev/urandom >"$TMP/www/big"
chmod 0644 "$TMP/www/big"
BIG_SHA=$(sha256sum "$TMP/www/big" | cut -d' ' -f1)

common_nginx_main() { # $1 = prefix dir
    cat <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
EOF
}
common_nginx_http() { # $1 = prefix dir
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

# Upstream: tiny response at /, 1 MiB static file at /big, and /check echoes
# the Authorization header it received (used only by the sanity check).
{
    common_nginx_main "$TMP/up"
    echo "http {"
    common_nginx_http "$TMP/up"
    cat <<EOF
    sendfile on;
    tcp_nopush on;
    server {
        listen 127.0.0.1:$UP_PORT;
        location = /big { root $TMP/www; }
        location = /check { return 200 "\$http_authorization\n"; }
        location / { return 200 "ok\n"; }
    }
}
EOF
} >"$TMP/up/nginx.conf"

# nginx as a reverse proxy in front of the upstream.
{
    common_nginx_main "$TMP/ngx"
    echo "http {"
    common_nginx_http "$TMP/ngx"
    cat <<EOF
    upstream backend {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$NGX_PORT;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer $TOKEN";
            # stream 1 MiB bodies through memory buffers, never via temp files
            proxy_max_temp_file_size 0;
        }
    }
}
EOF
} >"$TMP/ngx/nginx.conf"

# tokenrelay config + token file (0600).
printf '{"access_token":"%s","refresh_token":"bench-refresh-123456"}\n' "$TOKEN" >"$TMP/tokens.json"
chmod 0600 "$TMP/tokens.json"
cat >"$TMP/tokenrelay.json" <<EOF
{ "listen": "127.0.0.1:$TR_PORT",
  "upstream": { "url": "http://127.0.0.1:$UP_PORT" },
  "tokens": { "file": "$TMP/tokens.json" },
  "refresh": { "grant": "refresh_token", "token_url": "http://127.0.0.1:9/oauth/token", "client_id": "bench", "client_auth": "none" },
  "admin": { "listen": "127.0.0.1:$TR_ADMIN_PORT" } }
EOF

# ---------------------------------------------------------------- helpers
wait_port() { # port seconds
    local i
    for i in $(seq 1 $(($2 * 20))); do
        [[ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]] && return 0
        sleep 0.05
    done
    return 1
}
start_nginx() { # prefix -> sets NGINX_MASTER
    "$NGINX" -p "$1/" -e "$1/error.log" -c "$1/nginx.conf" &
    NGINX_MASTER=$!
    PIDS+=("$NGINX_MASTER")
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
cpu_ticks() { # utime+stime (fields 14,15); strip "pid (comm) " first
    sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
alive() { kill -0 "$1" 2>/dev/null; }

# ---------------------------------------------------------------- start
log "starting upstream nginx on 127.0.0.1:$UP_PORT"
start_nginx "$TMP/up"
UP_MASTER=$NGINX_MASTER
wait_port "$UP_PORT" 5 || { cat "$TMP/up/error.log" >&2; die "upstream nginx did not start"; }

log "starting nginx reverse proxy on 127.0.0.1:$NGX_PORT"
start_nginx "$TMP/ngx"
NGX_MASTER=$NGINX_MASTER
wait_port "$NGX_PORT" 5 || { cat "$TMP/ngx/error.log" >&2; die "nginx proxy did not start"; }
NGX_PID=$(nginx_worker "$NGX_MASTER") || die "nginx proxy worker not found"

log "starting tokenrelay on 127.0.0.1:$TR_PORT"
"$BIN" run --config "$TMP/tokenrelay.json" 2>"$TR_LOG" &
TR_PID=$!
PIDS+=("$TR_PID")
for _ in $(seq 1 100); do
    grep -q 'msg=listening' "$TR_LOG" 2>/dev/null && break
    alive "$TR_PID" || break
    sleep 0.05
done
grep -q 'msg=listening' "$TR_LOG" || { cat "$TR_LOG" >&2; die "tokenrelay did not start"; }
wait_port "$TR_PORT" 5 || die "tokenrelay not listening on $TR_PORT"

LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A PID_OF=([nginx]=$NGX_PID [tokenrelay]=$TR_PID)
declare -A PORT_OF=([nginx]=$NGX_PORT [tokenrelay]=$TR_PORT)
declare -A RSS_IDLE
for p in nginx tokenrelay; do RSS_IDLE[$p]=$(rss_kb "${PID_OF[$p]}"); done

# ---------------------------------------------------------------- sanity
for p in nginx tokenrelay; do
    port=${PORT_OF[$p]}
    got=$(curl -sS --max-time 5 "http://127.0.0.1:$port/check") || die "$p: /check failed"
    [[ "$got" == "Bearer $TOKEN" ]] || die "$p: upstream saw Authorization '$got'"
    got=$(curl -sS --max-time 5 "http://127.0.0.1:$port/") || die "$p: / failed"
    [[ "$got" == "ok" ]] || die "$p: / returned '$got'"
    got=$(curl -sS --max-time 10 "http://127.0.0.1:$port/big" | sha256sum | cut -d' ' -f1)
    [[ "$got" == "$BIG_SHA" ]] || die "$p: /big body differs from the upstream file"
done
log "sanity check passed (token injected, bodies intact through both proxies)"

# ---------------------------------------------------------------- measure
RAW=$RESULTS_DIR/latest-wrk.txt
: >"$RAW"

declare -A R_RPS R_P99 R_CPU R_RSS_AFTER R_ERR R_REQ
SCENARIOS=(small big)
declare -A PATH_OF=([small]=/ [big]=/big)
declare -A CONN_OF=([small]=$CONNECTIONS [big]=$BIG_CONNECTIONS)

for p in nginx tokenrelay; do
    pid=${PID_OF[$p]}
    for s in "${SCENARIOS[@]}"; do
        url="http://127.0.0.1:${PORT_OF[$p]}${PATH_OF[$s]}"
        c=${CONN_OF[$s]}
        log "$p / $s: warm-up ${WARMUP}s, then wrk -t1 -c$c -d${DURATION}s"
        wrk -t1 -c"$c" -d"${WARMUP}s" "$url" >/dev/null 2>&1 || true
        alive "$pid" || die "$p (pid $pid) died during warm-up"
        t0=$(cpu_ticks "$pid")
        out=$(wrk -t1 -c"$c" -d"${DURATION}s" --latency "$url" 2>&1) || true
        t1=$(cpu_ticks "$pid") || die "$p (pid $pid) died during the run"
        {
            echo "===== $p / $s: wrk -t1 -c$c -d${DURATION}s --latency $url"
            echo "$out"
            echo
        } >>"$RAW"
        alive "$pid" || die "$p (pid $pid) died during the run; see $RAW"
        req=$(awk '/requests in/ {print $1; exit}' <<<"$out")
        [[ -n "$req" && "$req" -gt 0 ]] || { echo "$out" >&2; die "$p / $s: wrk made no requests"; }
        R_REQ[$p.$s]=$req
        R_RPS[$p.$s]=$(awk '/^Requests\/sec:/ {printf "%.0f", $2; exit}' <<<"$out")
        R_P99[$p.$s]=$(awk '$1 == "99%" {print $2; exit}' <<<"$out")
        R_CPU[$p.$s]=$(awk -v d="$((t1 - t0))" -v hz="$CLK_TCK" -v n="$req" \
            'BEGIN {printf "%.1f", d / hz * 1e6 / n}')
        R_RSS_AFTER[$p.$s]=$(rss_kb "$pid")
        non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF; exit}' <<<"$out")
        sockerr=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10; exit}' <<<"$out")
        R_ERR[$p.$s]=$((${non2xx:-0} + ${sockerr:-0}))
        if [[ ${R_ERR[$p.$s]} -ne 0 ]]; then
            log "WARNING: $p / $s: non-2xx=${non2xx:-0} socket-errors=${sockerr:-0} (see $RAW)"
        fi
    done
done

# ---------------------------------------------------------------- report
mb() { awk -v k="$1" 'BEGIN {printf "%.1fM", k / 1024}'; }
REPORT=$RESULTS_DIR/latest.txt
{
    echo "tokenrelay vs nginx reverse proxy  ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $LOADAVG_START, $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "wrk -t1, ${DURATION}s per run after ${WARMUP}s warm-up; small = 3-byte body, c=$CONNECTIONS; big = 1 MiB body, c=$BIG_CONNECTIONS"
    echo "CPU = utime+stime of the proxy process (nginx: its single worker) over the run / requests"
    echo
    printf '%-8s %-11s %10s %9s %11s %9s %9s %7s\n' scenario proxy req/s p99 'CPU us/req' 'RSS idle' 'RSS after' errors
    for s in "${SCENARIOS[@]}"; do
        for p in nginx tokenrelay; do
            printf '%-8s %-11s %10s %9s %11s %9s %9s %7s\n' "$s" "$p" \
                "${R_RPS[$p.$s]}" "${R_P99[$p.$s]}" "${R_CPU[$p.$s]}" \
                "$(mb "${RSS_IDLE[$p]}")" "$(mb "${R_RSS_AFTER[$p.$s]}")" "${R_ERR[$p.$s]}"
        done
    done
    echo
    for s in "${SCENARIOS[@]}"; do
        awk -v s="$s" -v t="${R_CPU[tokenrelay.$s]}" -v n="${R_CPU[nginx.$s]}" \
            -v rt="${R_RPS[tokenrelay.$s]}" -v rn="${R_RPS[nginx.$s]}" 'BEGIN {
            printf "%-6s tokenrelay/nginx: CPU per request x%.2f, req/s x%.2f\n", s,
                (n > 0 ? t / n : 0), (rn > 0 ? rt / rn : 0) }'
    done
    echo "errors = wrk non-2xx/3xx responses + socket errors; raw wrk output: bench/results/latest-wrk.txt"
} | tee "$REPORT"

if grep -qiE 'error|warn|fatal' "$TR_LOG"; then
    log "tokenrelay logged warnings/errors:"
    grep -iE 'error|warn|fatal' "$TR_LOG" | sort | uniq -c | sort -rn | head -n 10 >&2
fi

# ---------------------------------------------------------------- perf (optional)
if [[ "$PERF" == 1 ]]; then
    if ! command -v perf >/dev/null 2>&1; then
        log "PERF=1 but perf is not installed (apt-get install linux-perf)"
    else
        set +e +o pipefail   # head closing pipes must not abort the script here
        PERF_OUT=$RESULTS_DIR/perf-latest.txt
        PERF_DATA=$RESULTS_DIR/perf-latest.data
        log "profiling tokenrelay with perf during a ${DURATION}s small-response run"
        perf record -q -F 999 -g -p "$TR_PID" -o "$PERF_DATA" -- sleep "$((DURATION + 1))" \
            >/dev/null 2>"$TMP/perf.err" &
        PERF_PID=$!
        sleep 0.5
        wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$TR_PORT/" >/dev/null 2>&1 || true
        wait "$PERF_PID" || { cat "$TMP/perf.err" >&2; log "perf record failed"; }
        if [[ -s "$PERF_DATA" ]]; then
            demangle() { if command -v swift-demangle >/dev/null 2>&1; then swift-demangle --simplified; else cat; fi; }
            tidy() { grep -v '^#' | grep -v '^$' | sed -e 's/[ -]*$//' | head -n "$1" | demangle; }
            {
                echo "perf: tokenrelay, small response, c=$CONNECTIONS, ${DURATION}s"
                echo "--- self (top 25 symbols) ---"
                perf report -i "$PERF_DATA" --no-children --sort symbol --stdio -g none \
                    --percent-limit 0.3 2>/dev/null | tidy 25
                echo "--- inclusive / children (top 40 symbols) ---"
                perf report -i "$PERF_DATA" --children --sort symbol --stdio -g none \
                    --percent-limit 1 2>/dev/null | tidy 40
                echo "--- by DSO ---"
                perf report -i "$PERF_DATA" --no-children --sort dso --stdio -g none \
                    2>/dev/null | tidy 15
            } >"$PERF_OUT"
            cat "$PERF_OUT"
            log "perf data kept in $PERF_DATA (perf report -i ... --children)"
        fi
        set -e -o pipefail
    fi
fi

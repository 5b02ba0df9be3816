#!/usr/bin/env bash
# Idle RSS of one tokenrelay binary, split into file-backed and anonymous pages.
#
#   bench/idle-rss.sh [BINARY]        (default: .build/release/tokenrelay, built beforehand)
#   IDLE_CLIENTS=10000 bench/idle-rss.sh BINARY   # also: per idle client connection, in bytes
#
# Starts the binary with a bench-style config (no upstream needed: an idle relay never connects), waits
# until it logs `msg=listening`, then reads /proc/PID/status (VmRSS) and /proc/PID/smaps_rollup
# (Rss, Rss of file-backed pages, anonymous pages). Prints one line per figure plus the binary's size and
# the shared libraries it loads, so each memory step can be compared with the previous one. Then the
# figure an operator sees: VmRSS after one /metrics scrape. With IDLE_CLIENTS=N, N connections are opened
# and left silent (clients that connected and have not sent a byte yet), and the growth of VmRSS and of
# the heap per connection is printed: what an idle client connection holds.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-.build/release/tokenrelay}
[[ -x "$BIN" ]] || { echo "no executable at $BIN (build it first)" >&2; exit 2; }
PORT=${PORT:-18680}
ADMIN_PORT=$((PORT + 1))

TMP=$(mktemp -d)
PID=""
cleanup() {
    if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT

printf '{"access_token":"%s","refresh_token":"bench-refresh-123456"}\n' "bench-access-0123456789abcdef" >"$TMP/tokens.json"
chmod 0600 "$TMP/tokens.json"
cat >"$TMP/tokenrelay.json" <<EOF
{ "listen": "127.0.0.1:$PORT",
  "upstream": { "url": "http://127.0.0.1:9" },
  "tokens": { "file": "$TMP/tokens.json" },
  "refresh": { "grant": "refresh_token", "token_url": "http://127.0.0.1:9/oauth/token", "client_id": "bench", "client_auth": "none" },
  "admin": { "listen": "127.0.0.1:$ADMIN_PORT" },
  "limits": { "max_client_connections": 20000 } }
EOF

"$BIN" run --config "$TMP/tokenrelay.json" 2>"$TMP/log" &
PID=$!
for _ in $(seq 1 200); do   # at most 10 s
    grep -q 'msg=listening' "$TMP/log" 2>/dev/null && break
    kill -0 "$PID" 2>/dev/null || { cat "$TMP/log" >&2; echo "tokenrelay exited" >&2; exit 1; }
    sleep 0.05
done
grep -q 'msg=listening' "$TMP/log" || { cat "$TMP/log" >&2; echo "tokenrelay did not start" >&2; exit 1; }

kib() { awk -v k="$1" '/^'"$1"':/ {print $2}' "$2"; }
rss=$(kib VmRSS "/proc/$PID/status")
file=$(kib RssFile "/proc/$PID/status")
anon=$(kib RssAnon "/proc/$PID/status")
shmem=$(kib RssShmem "/proc/$PID/status")
mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }
echo "binary        $BIN ($(mib $(($(stat -c %s "$BIN") / 1024))))"
echo "idle VmRSS    $(mib "$rss")"
echo "  file-backed $(mib "$file")"
echo "  anonymous   $(mib "$anon")"
echo "  shmem       $(mib "$shmem")"
echo "smaps_rollup:"
grep -E '^(Rss|Pss|Pss_Anon|Pss_File|Anonymous):' "/proc/$PID/smaps_rollup" | sed 's/^/  /'
echo "largest file-backed mappings (Rss, KiB):"
awk '/^[0-9a-f]+-[0-9a-f]+ / { name = $6 } /^Rss:/ { if (name != "") r[name] += $2 }
     END { for (n in r) if (r[n] > 0) printf "  %6d %s\n", r[n], n }' "/proc/$PID/smaps" | sort -rn | head -12

curl -s -o /dev/null "http://127.0.0.1:$ADMIN_PORT/metrics" || { echo "/metrics scrape failed" >&2; exit 1; }
scraped=$(kib VmRSS "/proc/$PID/status")
echo "after one /metrics scrape: VmRSS $(mib "$scraped")"

IDLE_CLIENTS=${IDLE_CLIENTS:-0}
if ((IDLE_CLIENTS > 0)); then
    cat >"$TMP/idle.py" <<'PY'
import resource, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
print(len(held), flush=True)
sys.stdin.read()
PY
    heap_kib() { awk '/\[heap\]/ { h = 1; next } /^[0-9a-f]+-/ { h = 0 } h && /^Rss:/ { s += $2 } END { print s + 0 }' "/proc/$PID/smaps"; }
    heap_before=$(heap_kib)
    anon_before=$(kib RssAnon "/proc/$PID/status")
    coproc IDLE { python3 "$TMP/idle.py" "$PORT" "$IDLE_CLIENTS" 2>&1; }
    opened=""
    read -r -t 120 opened <&"${IDLE[0]}" || true
    [[ "$opened" == "$IDLE_CLIENTS" ]] || { echo "could not open $IDLE_CLIENTS connections (${opened:-none})" >&2; exit 1; }
    prev=0   # tokenrelay accepts asynchronously: wait (bounded) until its RSS stops growing
    for _ in $(seq 1 50); do
        cur=$(kib VmRSS "/proc/$PID/status"); ((cur == prev)) && break; prev=$cur; sleep 0.2
    done
    held=$(kib VmRSS "/proc/$PID/status")
    anon_held=$(kib RssAnon "/proc/$PID/status")
    heap_held=$(heap_kib)
    echo "with $IDLE_CLIENTS idle clients: VmRSS $(mib "$held")"
    awk -v a="$scraped" -v b="$held" -v n="$IDLE_CLIENTS" 'BEGIN { printf "  per connection: VmRSS %.0f bytes\n", (b - a) * 1024 / n }'
    awk -v a="$anon_before" -v b="$anon_held" -v n="$IDLE_CLIENTS" 'BEGIN { printf "  per connection: anonymous %.0f bytes\n", (b - a) * 1024 / n }'
    awk -v a="$heap_before" -v b="$heap_held" -v n="$IDLE_CLIENTS" 'BEGIN { printf "  per connection: [heap] %.0f bytes\n", (b - a) * 1024 / n }'
    eval "exec ${IDLE[1]}>&-"
    wait "$IDLE_PID" 2>/dev/null || true
fi

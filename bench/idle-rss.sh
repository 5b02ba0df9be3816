#!/usr/bin/env bash
# Idle RSS of one tokenrelay binary, split into file-backed and anonymous pages.
#
#   bench/idle-rss.sh [BINARY]        (default: .build/release/tokenrelay, built beforehand)
#
# Starts the binary with a bench-style config (no upstream needed: an idle relay never connects), waits
# until it logs `msg=listening`, then reads /proc/PID/status (VmRSS) and /proc/PID/smaps_rollup
# (Rss, Rss of file-backed pages, anonymous pages). Prints one line per figure plus the binary's size and
# the shared libraries it loads, so each memory step can be compared with the previous one.
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
  "admin": { "listen": "127.0.0.1:$ADMIN_PORT" } }
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

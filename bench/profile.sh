#!/usr/bin/env bash
# Where tokenrelay's user-space instructions go per proxied request: callgrind's per-function inclusive and
# self costs over a fixed number of requests (counters zeroed after a warm-up), on the release build
# bench/run.sh measures (.build-bench, git-ignored like every .build*). Functions are named from the
# symbol table; code the optimiser inlined is charged to the function it was inlined into.
#
#   bench/profile.sh                    # data_plane transport, /small, 2000 requests
#   ENGINE=evhttp PATH_=large COUNT=40 bench/profile.sh
#   BIN=/path/to/tokenrelay SKIP_BUILD=1 bench/profile.sh   # another build (before/after a change)
#   UPSTREAM_TLS=1 bench/profile.sh     # the upstream over TLS (kept alive, verified against a throwaway CA)
#   DPOP=ES256 bench/profile.sh         # a DPoP proof signed per request (files get a -dpop-ALG suffix)
#   CACHE_SIM=1 DPOP=ES256 bench/profile.sh   # also valgrind's simulated cache misses (L1 and last level, user
#                                       # space only): the report adds them per request and per signature
#
# Knobs: ENGINE (transport|evhttp), PATH_ (small|large), COUNT (requests counted), CONNECTIONS (wrk, 4),
# BASE_PORT (3 consecutive ports from 18620), BIN, SKIP_BUILD=1, TOP (rows per table, 40), TAG (file suffix),
# UPSTREAM_TLS=1 (files get a -tls suffix). The report ends with the self costs summed per library
# (tokenrelay itself, libcrypto, libssl, libc, libevent, the kernel's vDSO): over TLS, where the cost is.
# A build with debug info (`-Xswiftc -g`) does not help here: valgrind 3.19 gives up on the DWARF 5
# forms (strx1, addrx) in the static Swift runtime's debug info, so the binary is profiled without it.
# Output: bench/results/profile-ENGINE-PATH[TAG].txt and the raw dump profile-ENGINE-PATH[TAG].callgrind
# (open with callgrind_annotate --tree=caller, or kcachegrind).
set -euo pipefail

ENGINE=${ENGINE:-transport}
PATH_=${PATH_:-small}
COUNT=${COUNT:-2000}
CONNECTIONS=${CONNECTIONS:-4}
BASE_PORT=${BASE_PORT:-18620}
SKIP_BUILD=${SKIP_BUILD:-0}
TOP=${TOP:-40}
UPSTREAM_TLS=${UPSTREAM_TLS:-0}
CACHE_SIM=${CACHE_SIM:-0}

BENCH_LOG_TAG=profile
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # BENCH_DIR, REPO_DIR, RESULTS_DIR, SCRATCH, log/die, PIDS/TMP cleanup
BIN=${BIN:-$SCRATCH/release/tokenrelay}
TAG=${TAG:-}
if [[ "$UPSTREAM_TLS" == 1 ]]; then TAG="-tls$TAG"; fi
if [[ "$CACHE_SIM" == 1 ]]; then TAG="-cache$TAG"; fi
UP_PORT=$BASE_PORT
TR_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))
TOKEN=bench-token-123456

for tool in wrk valgrind callgrind_annotate callgrind_control; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool missing (bench/run.sh installs wrk, nginx-light, valgrind)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx not found"

if [[ "$SKIP_BUILD" != 1 || ! -x "$BIN" ]]; then
    log "building tokenrelay (release) in ${SCRATCH#"$REPO_DIR"/}"
    (cd "$REPO_DIR" && swift build -c release --static-swift-stdlib --scratch-path "$SCRATCH" --product tokenrelay 2>&1 | tail -n 2) >&2
fi
[[ -x "$BIN" ]] || die "binary missing: $BIN"

mkdir -p "$RESULTS_DIR"
TMP=$(mktemp -d /tmp/tokenrelay-profile.XXXXXX)
chmod 0755 "$TMP"
mkdir -p "$TMP/www" "$TMP/up"
UPSTREAM_JSON="{ \"url\": \"http://127.0.0.1:$UP_PORT\" }"
if [[ "$UPSTREAM_TLS" == 1 ]]; then
    make_upstream_ca "$TMP/tls"
    UPSTREAM_JSON="{ \"url\": \"https://127.0.0.1:$UP_PORT\", \"tls\": { \"ca_file\": \"$TMP/tls/ca.pem\", \"server_name\": \"localhost\" } }"
fi
head -c 1048576 /dev/urandom >"$TMP/www/large"
chmod 0644 "$TMP/www/large"
SMALL_BODY=$(printf 'x%.0s' $(seq 1 99))
cat >"$TMP/up/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $TMP/up/nginx.pid;
error_log $TMP/up/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/up/client_body;
    proxy_temp_path $TMP/up/proxy;
    fastcgi_temp_path $TMP/up/fastcgi;
    uwsgi_temp_path $TMP/up/uwsgi;
    scgi_temp_path $TMP/up/scgi;
    default_type application/octet-stream;
    keepalive_requests 1000000;
    sendfile on;
    server {
        listen 127.0.0.1:$UP_PORT$([[ "$UPSTREAM_TLS" == 1 ]] && echo " ssl");
$([[ "$UPSTREAM_TLS" == 1 ]] && printf '        ssl_certificate %s;\n        ssl_certificate_key %s;\n        ssl_session_cache shared:upstream:4m;\n' "$TMP/tls/server.pem" "$TMP/tls/server.key")
        location = /large { root $TMP/www; }
        location = /small { return 200 "$SMALL_BODY\n"; }
    }
}
EOF
DPOP_JSON=""
if [[ -n "${DPOP:-}" ]]; then
    # As bench/run.sh: a key made by openssl, the bench tokens bound to it (a proof signed per request).
    DPOP_JKT=$("$BENCH_DIR/dpop_key.py" "$DPOP" "$TMP/dpop.pem") || die "DPOP must be ES256, ES384, EdDSA, RS256 or PS256"
    DPOP_JSON="\"dpop\": { \"alg\": \"$DPOP\", \"key_file\": \"$TMP/dpop.pem\" },"
    printf '{"access_token":"%s","refresh_token":"bench-refresh-123456","dpop_jkt":"%s"}\n' "$TOKEN" "$DPOP_JKT" >"$TMP/tokens.json"
    TAG="-dpop-$DPOP$TAG"
else
    printf '{"access_token":"%s","refresh_token":"bench-refresh-123456"}\n' "$TOKEN" >"$TMP/tokens.json"
fi
chmod 0600 "$TMP/tokens.json"
cat >"$TMP/tokenrelay.json" <<EOF
{ "listen": "127.0.0.1:$TR_PORT",
  "data_plane": "$ENGINE",
  "upstream": $UPSTREAM_JSON,
  "tokens": { "file": "$TMP/tokens.json" },
  $DPOP_JSON
  "refresh": { "grant": "refresh_token", "token_url": "http://127.0.0.1:9/oauth/token", "client_id": "bench", "client_auth": "none" },
  "admin": { "listen": "127.0.0.1:$ADMIN_PORT" } }
EOF
cp "$BENCH_DIR/wrk-count.lua" "$TMP/count.lua"
wrk_count() { # count -> wrk output
    local marker=$TMP/count.done w
    rm -f "$marker"
    COUNT=$1 MARKER=$marker wrk -t1 -c"$CONNECTIONS" -d600s -s "$TMP/count.lua" "http://127.0.0.1:$TR_PORT/$PATH_" >"$TMP/count.out" 2>&1 &
    w=$!
    for _ in $(seq 1 12000); do [[ -e "$marker" ]] && break; kill -0 "$w" 2>/dev/null || break; sleep 0.05; done
    kill -INT "$w" 2>/dev/null || true
    wait "$w" 2>/dev/null || true
    cat "$TMP/count.out"
}

"$NGINX" -p "$TMP/up/" -e "$TMP/up/error.log" -c "$TMP/up/nginx.conf" &
PIDS+=($!)
objcopy --strip-debug "$BIN" "$TMP/tokenrelay"
valgrind -q --tool=callgrind --cache-sim="$([[ "$CACHE_SIM" == 1 ]] && echo yes || echo no)" --callgrind-out-file="$TMP/cg.out" \
    "$TMP/tokenrelay" run --config "$TMP/tokenrelay.json" 2>"$TMP/tokenrelay.err" &
CG_PID=$!
PIDS+=("$CG_PID")
for _ in $(seq 1 3600); do
    grep -q 'msg=listening' "$TMP/tokenrelay.err" 2>/dev/null && break
    kill -0 "$CG_PID" 2>/dev/null || { cat "$TMP/tokenrelay.err" >&2; die "tokenrelay under callgrind exited"; }
    sleep 0.05
done
grep -q 'msg=listening' "$TMP/tokenrelay.err" || die "tokenrelay under callgrind did not start"

wrk_count 20 >/dev/null
callgrind_control -z "$CG_PID" >/dev/null 2>&1
out=$(wrk_count "$COUNT")
rm -f "$TMP/cg.out".*
callgrind_control -d "$CG_PID" >/dev/null 2>&1
n=$(awk '/requests in/ {print $1; exit}' <<<"$out")
dump=$(ls -t "$TMP/cg.out".* 2>/dev/null | head -n 1)
[[ -n "$dump" && -n "$n" && "$n" -gt 0 ]] || die "no callgrind dump"
RAW=$RESULTS_DIR/profile-$ENGINE-$PATH_$TAG.callgrind
cp "$dump" "$RAW"

demangle() { if command -v swift-demangle >/dev/null 2>&1; then swift-demangle --simplified; else cat; fi; }
total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
REPORT=$RESULTS_DIR/profile-$ENGINE-$PATH_$TAG.txt
{
    set +o pipefail   # `head` closes each table early: callgrind_annotate's broken pipe is expected
    echo "tokenrelay data_plane $ENGINE, /$PATH_, $n requests (c=$CONNECTIONS), $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo '?')"
    awk -v t="$total" -v n="$n" 'BEGIN {printf "user-space instructions: %d per request\n", t / n}'
    if [[ "$CACHE_SIM" == 1 ]]; then
        # callgrind's events with --cache-sim: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw (simulated L1 and last-level
        # caches of this machine's sizes; user space only, no L2 model).
        awk -v n="$n" '/^summary:/ {printf "simulated misses per request: L1 instruction %.0f, L1 data read %.0f, write %.0f; last level %.0f\n", $5 / n, $6 / n, $7 / n, ($8 + $9 + $10) / n; exit}' "$dump"
        echo "signing, inclusive per request (compare: the same figures per signature of openssl speed under callgrind, bench/README.md):"
        callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null | sed 's/([^)]*)//g' \
            | grep -E '(ECDSA_sign_ex|EVP_PKEY_sign|EVP_DigestSign|ossl_ed25519_sign|RSA_sign|SHA256_Update) ' \
            | awk -v n="$n" '{for (i = 1; i <= 9; i++) { gsub(",", "", $i); if ($i == ".") $i = 0 }
                   printf "  %-16s Ir %7.0f  L1 data read misses %5.0f  L1 instruction misses %5.0f  last-level misses %3.0f\n", $10, $1 / n, $5 / n, $4 / n, ($7 + $8 + $9) / n}'
    fi
    echo
    echo "--- inclusive (instructions per request, % of all) ---"
    callgrind_annotate --show=Ir --inclusive=yes --threshold=100 "$dump" 2>/dev/null \
        | awk -v n="$n" -v t="$total" '/^ *[0-9,]+ .*\(/ || /^ *[0-9,]+ +[^ ]/ {c = $1; gsub(",", "", c); if (c + 0 == 0) next; $1 = ""; if ($2 ~ /^\(/) $2 = ""; if ($3 ~ /^[0-9.]+%\)$/) $3 = ""; sub(/^ +/, ""); sub(/^\?\?\?:/, ""); sub(/ \[\/tmp\/tokenrelay-profile[^]]*\]$/, ""); printf "%9.0f %5.1f%%  %s\n", c / n, 100 * c / t, $0}' \
        | head -n "$TOP" | demangle
    echo
    echo "--- self (instructions per request, % of all) ---"
    callgrind_annotate --show=Ir --inclusive=no --threshold=100 "$dump" 2>/dev/null \
        | awk -v n="$n" -v t="$total" '/^ *[0-9,]+ +[^ ]/ {c = $1; gsub(",", "", c); if (c + 0 == 0) next; $1 = ""; if ($2 ~ /^\(/) $2 = ""; if ($3 ~ /^[0-9.]+%\)$/) $3 = ""; sub(/^ +/, ""); sub(/^\?\?\?:/, ""); sub(/ \[\/tmp\/tokenrelay-profile[^]]*\]$/, ""); printf "%9.0f %5.1f%%  %s\n", c / n, 100 * c / t, $0}' \
        | head -n "$TOP" | demangle
    echo
    echo "--- self by library (instructions per request, % of all) ---"
    # From the dump itself: a cost line right after `calls=` is that call's inclusive cost (skipped), every
    # other cost line belongs to the current function, whose library the last `ob=` named.
    awk 'function name_of(s,    id, rest) {
             if (match(s, /^\([0-9]+\)/)) { id = substr(s, 1, RLENGTH); rest = substr(s, RLENGTH + 2); if (rest != "") names[id] = rest; return names[id] }
             return s
         }
         /^ob=/ { ob = name_of(substr($0, 4)); next }
         /^cob=/ { name_of(substr($0, 5)); next }
         /^calls=/ { skip = 1; next }
         /^[0-9+*-]/ { if (skip) { skip = 0; next } if (NF >= 2) self[ob] += $2; next }
         { skip = 0 }
         END { for (o in self) { n = o; sub(/.*\//, "", n); printf "%s\t%d\n", n, self[o] } }' "$dump" \
        | awk -F'\t' -v n="$n" -v t="$total" '{printf "%9.0f %5.1f%%  %s\n", $2 / n, 100 * $2 / t, ($1 == "tokenrelay" ? "tokenrelay (static Swift runtime included)" : $1)}' \
        | sort -rn
} | tee "$REPORT"
log "dump kept in $RAW"

# What bench/run.sh, bench/profile.sh and bench/h2.sh share, sourced by each after it has set BENCH_LOG_TAG
# (the prefix of its log lines): where the repository and the release build are, log/die, the throwaway
# upstream CA, and the cleanup that stops every process the script started (by its PID, in PIDS) and
# removes its temporary directory (TMP) on any exit.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
RESULTS_DIR=$BENCH_DIR/results
SCRATCH=$REPO_DIR/.build-bench

log() { printf '[%s] %s\n' "$BENCH_LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$BENCH_LOG_TAG" "$*" >&2; exit 1; }

PIDS=()
TMP=""
# SIGTERM, then SIGKILL if the process is still there after 10 s.
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    local pid
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    if [[ -n "$TMP" && -d "$TMP" ]]; then rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# make_upstream_ca DIR: a throwaway CA (DIR/ca.pem) and a certificate for "localhost" and 127.0.0.1 signed
# by it (DIR/server.pem, DIR/server.key), for an upstream served over TLS that only this CA verifies.
make_upstream_ca() {
    mkdir -p "$1"
    (
        cd "$1"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tokenrelay bench CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf \
            -out server.pem 2>/dev/null
        chmod 0644 ca.pem server.pem server.key
    ) || die "could not make the bench CA and certificate with openssl"
}

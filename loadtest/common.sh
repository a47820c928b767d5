# What loadtest/profile.sh and loadtest/perf.sh share (sourced, not run): the build of loadtest/load,
# free loopback ports, the processes to stop at exit, and a redis-server for the Redis rows.
# Expects $here (loadtest/) and $out (the output directory); sets $bin, and $extra / $rpid when
# start_redis runs.

root="$(dirname "$here")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target-bench}"
mkdir -p "$out"
cargo build --release --ignore-rust-version --manifest-path "$here/load/Cargo.toml" --bins >&2
bin="$CARGO_TARGET_DIR/release"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start_redis [CORE]: a redis-server on a free port (pinned to CORE when given); sets $extra to
# load-server's --redis-url argument and $rpid to its pid.
extra=()
start_redis() {
    local rport pin=()
    rport="$(free_port)"
    [ -n "${1:-}" ] && pin=(taskset -c "$1")
    "${pin[@]}" redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no \
        --loglevel warning >"$out/redis.log" 2>&1 &
    pids+=($!)
    rpid=$!
    for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
    extra=(--redis-url "redis://127.0.0.1:$rport/")
}

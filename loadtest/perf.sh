#!/usr/bin/env bash
# Where a row's server spends its time under the wrk load (sampling, with the kernel's share):
#
#   loadtest/perf.sh ROW [WORKLOAD] [SECONDS]      # e.g. loadtest/perf.sh memory replay 6
#
# Starts redis-server for the Redis rows, load-server on core 0, stores the replay keys, runs
# wrk on core 1 as `loadtest/run.sh --mode wrk` does (2 s unmeasured, then SECONDS), and records
# the server (and redis-server) with `perf record --call-graph dwarf` for 4 s in the middle.
# Prints wrk's figures, the share of the server's samples by module, the top functions by self
# time, and the inclusive share of the crate's parts. Output files stay in $OUT (default
# /tmp/tower-idempotency-perf). Needs perf (Debian: linux-perf), wrk, taskset, python3, curl.
set -euo pipefail

row="${1:?row}"; workload="${2:-replay}"; secs="${3:-6}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-/tmp/tower-idempotency-perf}"
for tool in perf wrk taskset python3 curl; do
    command -v "$tool" >/dev/null || { echo "loadtest/perf.sh: $tool is not installed" >&2; exit 1; }
done
# shellcheck source=common.sh
source "$here/common.sh"

if [[ "$row" == *redis* ]]; then
    start_redis 0
fi

"$bin/load-driver" --write-body "$out/order.json"
port="$(free_port)"
taskset -c 0 "$bin/load-server" --row "$row" --port "$port" "${extra[@]}" 2>"$out/server.log" &
pids+=($!)
spid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break; sleep 0.1; done

prefix=f-
if [ "$workload" = replay ]; then
    prefix=r-
    for i in $(seq 0 99); do
        curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/orders" \
            -H 'Content-Type: application/json' -H 'Authorization: Bearer client-0042' \
            -H 'Cookie: session=9f86d081884c7d659a2feaa0c55ad015; theme=dark' \
            -H "Idempotency-Key: \"r-$i\"" --data-binary "@$out/order.json"
    done
fi
script="$here/wrk/orders.lua"
taskset -c 1 wrk -t1 -c64 -d2s -s "$script" "http://127.0.0.1:$port" -- \
    "$workload" "$out/order.json" "${prefix}w" 100 >/dev/null
taskset -c 1 wrk -t1 -c64 "-d${secs}s" -s "$script" "http://127.0.0.1:$port" -- \
    "$workload" "$out/order.json" "${prefix}m" 100 >"$out/wrk.txt" &
wpid=$!
sleep 1
data="$out/perf.$row.$workload.data"
record=(-p "$spid")
[ -n "${rpid:-}" ] && record=(-p "$spid,$rpid")
perf record -q -F 999 --call-graph dwarf,16384 "${record[@]}" -o "$data" -- sleep 4 2>/dev/null
wait "$wpid"
tail -1 "$out/wrk.txt"

# (`|| true`: head closing the pipe early is not a failure)
perf report -i "$data" --no-children --sort comm,dso --stdio -g none 2>/dev/null \
    | grep '%' | head -8 || true
echo "top functions, self time:"
perf report -i "$data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null \
    | grep '%' | head -30 | cut -c1-140 || true
perf script -i "$data" --no-inline 2>/dev/null >"$out/perf.$row.$workload.txt"
echo "inclusive share of the samples:"
python3 - "$out/perf.$row.$workload.txt" <<'PY'
import re, sys
samples = [s for s in open(sys.argv[1]).read().split("\n\n") if s.strip()]
groups = [
    ("the crate (all of tower_idempotency)", r"tower_idempotency::"),
    ("  SHA-256 (fingerprint, store key)", r"sha2::"),
    ("  the store's claim (engine begin)", r"Engine<S>::begin"),
    ("  the store's complete (engine complete)", r"Engine<S>::complete|service::complete"),
    ("  making room (eviction)", r"make_room|give_room|evict"),
    ("  replay (record to response)", r"replay::replay_http"),
    ("  classify (response to record)", r"classify::classify"),
    ("the handler's JSON parse", r"serde_json::"),
    ("malloc / free", r"\b(malloc|_int_malloc|_int_free|cfree|free|realloc|malloc_consolidate)\b"),
    ("memmove / memcpy", r"__memmove|__memcpy"),
    ("the kernel's wake-up of the peer (sock_def_readable)", r"sock_def_readable"),
]
n = len(samples)
for name, pat in groups:
    hit = sum(1 for s in samples if re.search(pat, s))
    print(f"{100 * hit / n:6.2f}%  {name}")
PY

#!/usr/bin/env bash
# CPU time of one row's server per request, under load: what a wall-clock rate on a shared
# machine hides. Another process on the server's core takes turns with it, but the time the
# kernel accounts to the server is its own.
#
#   loadtest/cputime.sh ROW [WORKLOAD] [REQUESTS]    # e.g. loadtest/cputime.sh memory fresh 100000
#
# Starts redis-server for the Redis rows and load-server, both on core 0, as
# `loadtest/run.sh --mode wrk` does; load-gen drives it from core 1 with 64 connections. It
# sends WARMUP requests first (default 20000; 110000 fills `memory-bounded` to its cap, so each
# fresh request then evicts a record), then REQUESTS (default 100000), and prints the server's
# user and kernel time per measured request, in µs, from /proc (the whole process, every
# thread), and redis-server's. LOAD_SERVER names another load-server binary (a copy of an
# earlier build, to compare two builds: run them in turn, A B A B). Output files stay in $OUT
# (default /tmp/tower-idempotency-cputime).
set -euo pipefail

row="${1:?row}"; workload="${2:-fresh}"; requests="${3:-100000}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-/tmp/tower-idempotency-cputime}"
# shellcheck source=common.sh
source "$here/common.sh"

if [[ "$row" == *redis* ]]; then
    start_redis 0
fi
port="$(free_port)"
taskset -c 0 "${LOAD_SERVER:-$bin/load-server}" --row "$row" --port "$port" "${extra[@]}" \
    2>"$out/server.$row.log" &
spid=$!
pids+=($spid)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break; sleep 0.1; done

gen=(taskset -c 1 "$bin/load-gen" --addr "127.0.0.1:$port" --workload "$workload" --connections 64)
"${gen[@]}" --requests "${WARMUP:-20000}" --key-prefix w >/dev/null
# utime + stime of a process, in clock ticks, as "user sys".
ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
read -r su0 ss0 < <(ticks "$spid")
[ -n "${rpid:-}" ] && read -r ru0 rs0 < <(ticks "$rpid")
t0="$(date +%s.%N)"
"${gen[@]}" --requests "$requests" >"$out/gen.$row.$workload.json"
t1="$(date +%s.%N)"
read -r su1 ss1 < <(ticks "$spid")
[ -n "${rpid:-}" ] && read -r ru1 rs1 < <(ticks "$rpid")
python3 - "$out/gen.$row.$workload.json" "$(getconf CLK_TCK)" "$su0" "$ss0" "$su1" "$ss1" \
    "${ru0:-0}" "${rs0:-0}" "${ru1:-0}" "${rs1:-0}" "$row" "$workload" "$t0" "$t1" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
hz = int(sys.argv[2])
su0, ss0, su1, ss1, ru0, rs0, ru1, rs1 = map(int, sys.argv[3:11])
row, workload = sys.argv[11], sys.argv[12]
wall = float(sys.argv[14]) - float(sys.argv[13])
n = g["sent_total"]
us = lambda t: t * 1e6 / hz / n
user, kernel = us(su1 - su0), us(ss1 - ss0)
line = (f"row {row}, workload {workload}: {n} requests, server {user + kernel:.2f} µs per request"
        f" (user {user:.2f}, kernel {kernel:.2f})")
if ru1 or rs1:
    line += f", redis-server {us(ru1 - ru0) + us(rs1 - rs0):.2f} µs"
statuses = g.get("statuses", {})
print(line + f"; {n / wall:.0f} req/s wall, statuses {statuses}")
PY

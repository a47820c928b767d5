#!/usr/bin/env bash
# Instruction counts of one row's server under valgrind's callgrind, for a fixed number of
# requests (deterministic, unlike timings on a busy machine):
#
#   loadtest/profile.sh ROW [WORKLOAD] [REQUESTS]     # e.g. loadtest/profile.sh memory fresh 5000
#
# Starts redis-server for the Redis rows, load-server under callgrind on 127.0.0.1, zeroes the
# counters once it answers, sends REQUESTS requests over 8 connections, dumps, and prints the
# instructions per request and the top inclusive / exclusive functions. Output files stay in
# $OUT (default /tmp/tower-idempotency-profile). LOAD_SERVER names another load-server binary
# to profile (a copy of an earlier build, to compare two builds row by row); by default the one
# just built. PREFILL=N sends N fresh requests before the counters are zeroed, with keys of
# their own: `PREFILL=100000 loadtest/profile.sh memory-bounded fresh 5000` profiles the
# bounded store at its cap, where each fresh request evicts a record.
set -euo pipefail

row="${1:?row}"; workload="${2:-fresh}"; requests="${3:-5000}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-/tmp/tower-idempotency-profile}"
# shellcheck source=common.sh
source "$here/common.sh"

if [[ "$row" == *redis* ]]; then
    start_redis
fi

port="$(free_port)"
file="$out/callgrind.$row.$workload.out"
rm -f "$file"*
valgrind --tool=callgrind --callgrind-out-file="$file" \
    "${LOAD_SERVER:-$bin/load-server}" --row "$row" --port "$port" "${extra[@]}" 2>"$out/valgrind.$row.log" &
vpid=$!
pids+=($vpid)
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break; sleep 0.1; done
login=(); [[ "$row" == axum-idempotent ]] && login=(--login)
# The replay workload's pre-warm requests run before the counters are zeroed.
if [[ "$workload" == replay ]]; then
    timeout 300 "$bin/load-gen" --addr "127.0.0.1:$port" --workload replay --connections 8 --requests 8 "${login[@]}" >/dev/null
fi
if [[ "${PREFILL:-0}" -gt 0 ]]; then
    timeout 1800 "$bin/load-gen" --addr "127.0.0.1:$port" --workload fresh --connections 8 --requests "$PREFILL" --key-prefix p "${login[@]}" >/dev/null
fi
callgrind_control -z "$vpid" >/dev/null
timeout 900 "$bin/load-gen" --addr "127.0.0.1:$port" --workload "$workload" --connections 8 --requests "$requests" "${login[@]}" >"$out/gen.$row.$workload.json"
callgrind_control -d "$vpid" >/dev/null
sleep 1
dump="$(ls -t "$file"* | head -1)"
sent="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sent_total"])' "$out/gen.$row.$workload.json")"
total="$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1; exit}')"
echo "row $row, workload $workload: $sent requests, $total instructions, $((total / sent)) per request"
echo "--- inclusive (top 40) ---"
callgrind_annotate --inclusive=yes "$dump" 2>/dev/null | sed -n '/^Ir/,$p' | head -45
echo "--- exclusive (top 40) ---"
callgrind_annotate "$dump" 2>/dev/null | sed -n '/^Ir/,$p' | head -45

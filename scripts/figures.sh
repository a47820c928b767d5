#!/usr/bin/env bash
# The figures of RELIABILITY.md that are measured, not asserted: timings, per-process splits and
# counts that move from run to run. Each ROW names one test run; this script runs it with
# `--nocapture` and prints the lines the test prints (its figures), without cargo's or the test
# harness's own lines. The test's assertions still hold: a failing run exits non-zero.
#
#   scripts/figures.sh ROW            # run the row's test and print its figure lines
#   scripts/figures.sh --command ROW  # print the cargo command the row runs
#   scripts/figures.sh --list         # the rows
#
# Run it from anywhere; commands run from the repository root. Servers must be on PATH
# (TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 is set: a missing server fails the run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

req="TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1"
t="cargo test -p tower-idempotency --all-features"

command_of() {
    case "$1" in
    storm-memory) echo "$t --test e2e -- storm_memory:: --nocapture" ;;
    storm-redis) echo "$req $t --test e2e -- storm_redis:: --nocapture" ;;
    storm-redis-full) echo "$req STORM_KEYS=1000 STORM_DUPLICATES=50 $t --test e2e -- storm_redis:: --nocapture" ;;
    message-storm) echo "$req $t --test message -- storm:: --nocapture" ;;
    message-storm-full) echo "$req STORM_MESSAGES=1000 STORM_DELIVERIES=50 $t --test message -- storm:: --nocapture" ;;
    two-processes) echo "$req $t --test e2e -- redis::two_processes --nocapture" ;;
    redis-outage) echo "$req $t --test e2e -- redis::redis_outage --nocapture" ;;
    lease) echo "$req $t --test faults -- lease:: --nocapture" ;;
    proxy-claims) echo "$req $t --test faults -- proxy::claims --nocapture" ;;
    proxy-lost-complete) echo "$req $t --test faults -- proxy::a_lost_complete --nocapture" ;;
    proxy-delayed-complete) echo "$req $t --test faults -- proxy::a_complete_delayed_by_a_healed --nocapture" ;;
    proxy-half-open) echo "$req $t --test faults -- proxy:: half_open failed_replacement --nocapture" ;;
    redis-restart) echo "$req $t --test faults -- restart:: --nocapture" ;;
    failover-storm) echo "$req $t --test faults -- --ignored failover_storm_figures --nocapture" ;;
    partition-storm) echo "$req $t --test faults -- --ignored partition_storm_figures --nocapture" ;;
    postgres-kill) echo "$req $t --test faults -- --ignored postgres_kill_figures --nocapture" ;;
    steps-crash) echo "$req $t --test faults -- steps --nocapture" ;;
    cluster-silent) echo "$req $t --test store -- redis_cluster::a_silent_cluster_connection_is_replaced --nocapture" ;;
    sentinel) echo "$req $t --test store -- redis_sentinel --nocapture" ;;
    nothing-secret) echo "$req $t --test store -- security_at_rest::nothing_secret --nocapture" ;;
    *) return 1 ;;
    esac
}

rows="storm-memory storm-redis storm-redis-full message-storm message-storm-full two-processes
redis-outage lease proxy-claims proxy-lost-complete proxy-delayed-complete proxy-half-open
redis-restart failover-storm partition-storm postgres-kill steps-crash cluster-silent sentinel
nothing-secret"

usage() { sed -n '2,13p' "$0" >&2; exit 2; }

case "${1:-}" in
--list) printf '%s\n' $rows ;;
--command)
    [ $# -eq 2 ] || usage
    command_of "$2" || { echo "figures.sh: no row $2 (see --list)" >&2; exit 2; }
    ;;
"" | -*) usage ;;
*)
    [ $# -eq 1 ] || usage
    cmd=$(command_of "$1") || { echo "figures.sh: no row $1 (see --list)" >&2; exit 2; }
    echo "# $1: $cmd"
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC')"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    status=0
    bash -c "$cmd" >"$log" 2>&1 || status=$?
    # The test's own lines: everything but cargo's progress and the harness's bookkeeping.
    grep -vE '^\s*(Compiling|Finished|Running|Blocking|Doc-tests|warning:|running [0-9]+ tests?$|test result:|successes:|failures:|$)|^test .* \.\.\. |^---- ' "$log" || true
    if [ "$status" -ne 0 ]; then
        echo "figures.sh: $1 failed (exit $status); its last lines:" >&2
        tail -n 30 "$log" >&2
    fi
    exit "$status"
    ;;
esac

#!/usr/bin/env bash
# The load benchmark, one command (see BENCHMARKS.md):
#
#   loadtest/run.sh                       # every row × workload, 3 runs, medians (about 10 minutes)
#   loadtest/run.sh --runs 1 --duration 2 --warmup 1     # a quick smoke run
#   loadtest/run.sh --mode long           # 60 s of fresh keys: req/s of the first and last 10 s
#   loadtest/run.sh --mode wrk            # BENCHMARKS.md's table: every row of it under wrk, 2 runs,
#                                         # 2 s of warm-up then 5 s measured per case; prints the
#                                         # table, the ratios against the peer and pgbench's
#   loadtest/run.sh --rows bare,memory --workloads fresh --out /tmp/x.md
#   loadtest/run.sh --mode wrk --rows bare,postgres-pool,postgres,postgres-durable
#                                         # PostgreSQL rows, each beside pgbench (below)
#
# PostgreSQL rows: `postgres` (durability off), `postgres-durable` (fsync, synchronous_commit and
# full_page_writes on, as deployed), `postgres-pool` (the store over a sqlx pool with sqlx's
# defaults, on `postgres`'s server). After each `postgres` or `postgres-durable` case, in the
# same run, pgbench sends the store's own statements (loadtest/pgbench/fresh.sql, replay.sql) to
# the same server, pinned to the server's core, with the store's 10 connections; the section
# "PostgreSQL at its own limit" compares the two. Needs pgbench (Debian: postgresql-client).
#
# Builds loadtest/load (its own workspace, not part of the crate's) in release mode, then runs
# load-driver, which starts redis-server and one load-server per case on 127.0.0.1, pins them
# to core 0 and the generator to core 1, and kills everything it started before it exits.
# Needs: Linux with 2+ cores, taskset (util-linux), redis-server (Debian: apt-get install
# redis-server). The peer crate `idempotent` 2.0.0 declares rust-version 1.98; it builds with
# older compilers, hence --ignore-rust-version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target-bench}"

tools="taskset redis-server"
case " $* " in *" wrk "*|*"--mode=wrk"*) tools="$tools wrk pgbench" ;; esac
for tool in $tools; do
    command -v "$tool" >/dev/null || { echo "loadtest/run.sh: $tool is not installed" >&2; exit 1; }
done
if [ "$(nproc)" -lt 2 ]; then
    echo "loadtest/run.sh: needs 2 cores (server on core 0, generator on core 1)" >&2
    exit 1
fi

cargo build --release --ignore-rust-version --manifest-path "$here/load/Cargo.toml" --bins >&2

# Bounded: the whole run is stopped after an hour whatever happens.
LOAD_COMMAND="loadtest/run.sh${*:+ $*}" exec timeout --signal=TERM --kill-after=10 3600 \
    "$CARGO_TARGET_DIR/release/load-driver" "$@"

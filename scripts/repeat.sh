#!/usr/bin/env bash
# Runs one test binary N times in a row and counts the runs with nothing failed.
#
#   scripts/repeat.sh BINARY N [EXTRA TEST HARNESS ARGS...]
#   scripts/repeat.sh store 5
#
# Builds `--test BINARY` once (all features), then runs that executable N times (so a build
# in the same tree meanwhile does not change what is counted) with
# TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1, so a server that cannot start is a failure, never a
# skip. Prints one line per run (passed, failed, ignored, seconds) and at the end
# `BINARY: K/N runs passed, P passed each`; exits non-zero when a run failed, and keeps that
# run's output in target/repeat/BINARY-RUN.log.
#
# To show that the suite does not depend on an idle machine, run it with a build beside it,
# for example in another shell:
#   while :; do CARGO_TARGET_DIR=/tmp/beside cargo build -p tower-idempotency --all-features \
#       --release; cargo clean --target-dir /tmp/beside; done
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if (($# < 2)); then
    echo "usage: scripts/repeat.sh BINARY N [EXTRA TEST HARNESS ARGS...]" >&2
    exit 2
fi
binary=$1
runs=$2
shift 2

export TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1
exe=$(cargo test -p tower-idempotency --all-features --test "$binary" --no-run \
    --message-format=json | sed -nE 's/.*"executable":"([^"]+)".*/\1/p' | tail -1)
if [[ -z $exe ]]; then
    echo "repeat: no test executable for --test $binary" >&2
    exit 1
fi
# As `cargo test` runs it: from the package root, with the manifest directory set.
export CARGO_MANIFEST_DIR=$PWD

logs="${CARGO_TARGET_DIR:-target}/repeat"
mkdir -p "$logs"
ok=0
passed_each=()
for ((i = 1; i <= runs; i++)); do
    log="$logs/$binary-$i.log"
    start=$(date +%s)
    status=0
    "$exe" "$@" >"$log" 2>&1 ||
        status=$?
    took=$(($(date +%s) - start))
    result=$(grep -E '^test result:' "$log" | tail -1 || true)
    passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$result")
    failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$result")
    ignored=$(sed -nE 's/.* ([0-9]+) ignored.*/\1/p' <<<"$result")
    if ((status == 0)); then
        ok=$((ok + 1))
        passed_each+=("${passed:-?}")
        rm -f "$log"
        echo "$binary run $i/$runs: ok, ${passed:-?} passed, ${ignored:-0} ignored, ${took} s"
    else
        echo "$binary run $i/$runs: FAILED (exit $status), ${passed:-?} passed," \
            "${failed:-?} failed, ${took} s; output in $log"
        grep -E '^    [a-z_:0-9]+$|^test .* FAILED$' "$log" | sort -u | sed 's/^/  /' || true
    fi
done
each=$(printf '%s\n' "${passed_each[@]:-}" | sort -u | paste -sd/ -)
echo "$binary: $ok/$runs runs passed, ${each:-0} passed each"
((ok == runs))

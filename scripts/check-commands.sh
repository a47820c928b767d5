#!/usr/bin/env bash
# Every reproduce command in the docs runs as written and selects at least one test.
#
#   scripts/check-commands.sh [FILE.md ...]    (default: RELIABILITY.md BENCHMARKS.md)
#
# Takes each `cargo test ...`, `cargo bench ...` and `scripts/test.sh ...` command from the
# files (in backticks, or a line of a code block), with its leading VAR=value settings, and
# runs it from the repository root with `--list` passed to the test harness: the tests are
# listed, never run, so no server is started. A command fails the check when cargo fails
# (no such package, target or feature), when it lists no test or benchmark, or when one of its
# filters selects none (a command of several filters lists the tests of any).
#
# `scripts/test.sh ARGS` is checked as the command it runs, `cargo test --workspace
# --all-features ARGS`; `scripts/figures.sh ROW` as the command of its row
# (`scripts/figures.sh --command ROW`), and every row of that script is checked too.
# `cargo bench` is listed with `--profile test`: the same targets and filters, without a
# second, optimized build of every dependency.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

files=("$@")
if ((${#files[@]} == 0)); then
    files=(RELIABILITY.md BENCHMARKS.md)
fi

# One command per line: backticked spans and code-block lines that start (after VAR=value
# settings) with `cargo test`, `cargo bench` or `scripts/test.sh`, or that are
# `scripts/figures.sh ROW`; a trailing `# comment` is dropped.
extract() {
    local file=$1
    {
        grep -o '`[^`]*`' "$file" | sed 's/^`//; s/`$//'
        awk '/^```/ { inside = !inside; next } inside { print }' "$file" | sed 's/[[:space:]]*#.*$//'
    } | grep -E '^([A-Z_][A-Z0-9_]*=[^ ]* )*((cargo (test|bench)|scripts/test\.sh)( |$)|scripts/figures\.sh [a-z][a-z0-9-]*$)' || true
}

commands=()
for f in "${files[@]}"; do
    while IFS= read -r line; do
        commands+=("$line")
    done < <(extract "$f")
done

if ((${#commands[@]} == 0)); then
    echo "check-commands: no command found in ${files[*]}" >&2
    exit 1
fi

# Every row of scripts/figures.sh, cited or not: a row whose test was renamed fails here.
while IFS= read -r row; do
    commands+=("scripts/figures.sh $row")
done < <(scripts/figures.sh --list)

# Unique, in order of first appearance.
mapfile -t commands < <(printf '%s\n' "${commands[@]}" | awk '!seen[$0]++')

# The command's test filters that select no test of the listing on stdin: a command of several
# filters lists the tests of any, so one renamed filter would pass unseen. Filters are the
# words cargo passes to the harness: a TESTNAME before `--` and the free words after it. A
# libtest filter is a substring of a test's name (its whole name with `--exact`); a criterion
# filter (`cargo bench`) is a regular expression. Prints them and fails when there are any.
unmatched() {
    python3 -c "$unmatched_py" "$1"
}
# (The program is an argument, not stdin: stdin carries the listing.)
unmatched_py=$(
    cat <<'PY'
import re
import shlex
import sys

words = [w for w in shlex.split(sys.argv[1]) if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]
bench = words[:2] == ["cargo", "bench"]
# cargo's and the harness's options that take a value.
valued = {"-p", "--package", "--test", "--bench", "--bin", "--example", "--features", "-F",
          "--profile", "--target", "--target-dir", "-j", "--jobs", "--manifest-path",
          "--color", "--message-format", "--config", "-Z", "--skip", "--test-threads",
          "--format", "--logfile", "--report-time", "--shuffle-seed"}
filters, exact, after, i = [], False, False, 2
while i < len(words):
    w = words[i]
    if w == "--" and not after:
        after = True
    elif w in valued:
        i += 1
    elif w == "--exact":
        exact = True
    elif not w.startswith("-"):
        filters.append(w)
    i += 1
names = [m.group(1) for m in re.finditer(r"^(.*): (?:test|benchmark)$", sys.stdin.read(), re.M)]
def selects(f):
    if bench:
        return any(re.search(f, n) for n in names)
    return any((n == f) if exact else (f in n) for n in names)
missed = [f for f in filters if not selects(f)]
print(" ".join(missed))
sys.exit(1 if missed else 0)
PY
)

failed=0
checked=0
for cmd in "${commands[@]}"; do
    run=$cmd
    if [[ $run == scripts/figures.sh\ * ]]; then
        if ! run=$(scripts/figures.sh --command "${run#scripts/figures.sh }"); then
            echo "FAIL (no such row): $cmd" >&2
            failed=$((failed + 1))
            checked=$((checked + 1))
            continue
        fi
    fi
    run=${run/scripts\/test.sh/cargo test --workspace --all-features}
    run=${run/cargo bench/cargo bench --profile test}
    # `--list` goes to the harness: after the command's own `--`, or after a new one.
    if [[ " $run " == *" -- "* ]]; then
        run="$run --list"
    else
        run="$run -- --list"
    fi
    checked=$((checked + 1))
    if ! out=$(bash -c "$run" 2>&1); then
        echo "FAIL (cargo failed): $cmd" >&2
        echo "$out" | tail -n 5 | sed 's/^/    /' >&2
        failed=$((failed + 1))
        continue
    fi
    n=$(grep -cE ': (test|benchmark)$' <<<"$out" || true)
    if ((n == 0)); then
        echo "FAIL (selects no test): $cmd" >&2
        failed=$((failed + 1))
    elif ! missed=$(unmatched "$run" <<<"$out"); then
        echo "FAIL (a filter selects no test: $missed): $cmd" >&2
        failed=$((failed + 1))
    else
        echo "ok ($n): $cmd"
    fi
done

echo "check-commands: $((checked - failed)) of $checked commands select at least one test"
((failed == 0))

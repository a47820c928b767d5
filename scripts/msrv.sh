#!/usr/bin/env bash
# The declared minimum Rust holds: no dependency a package builds needs a newer Rust than the
# `rust-version` its manifest declares.
#
#   scripts/msrv.sh
#
# Reads `cargo metadata --format-version 1 --all-features` (the lockfile's resolution, every
# feature on) and walks each workspace member's normal and build dependencies, transitively.
# A dependency whose `rust-version` is newer than the member's fails the check. Dependencies
# reached only through dev-dependencies (tests, benches, examples) are listed, not failed:
# a user's build never compiles them.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

metadata="$(mktemp)"
trap 'rm -f "$metadata"' EXIT
cargo metadata --format-version 1 --all-features --locked >"$metadata"

python3 - "$metadata" <<'PY'
import json
import sys

meta = json.loads(open(sys.argv[1]).read())
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}


def version(text):
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def reach(start, with_dev):
    """Every package start builds: normal and build edges, and dev ones from start itself."""
    seen, todo = set(), [start]
    while todo:
        pid = todo.pop()
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if not (kinds - {"dev"}) and not (with_dev and pid == start):
                continue
            if dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return seen


failed = False
members = sorted(meta["workspace_members"], key=lambda m: packages[m]["name"])
for member in members:
    pkg = packages[member]
    me = pkg["name"]
    ours = pkg.get("rust_version")
    if ours is None:
        print(f"{me}: no rust-version declared", file=sys.stderr)
        failed = True
        continue
    built = reach(member, with_dev=False)
    tested = reach(member, with_dev=True) - built
    newer = lambda ids: sorted(
        (packages[i]["name"], packages[i]["version"], packages[i]["rust_version"])
        for i in ids
        if i not in meta["workspace_members"]
        and packages[i].get("rust_version")
        and version(packages[i]["rust_version"]) > version(ours)
    )
    for name, ver, needs in newer(built):
        print(f"{me} declares Rust {ours}, but {name} {ver} needs {needs}", file=sys.stderr)
        failed = True
    for name, ver, needs in newer(tested):
        print(f"note: {me}: dev-dependency {name} {ver} needs Rust {needs} (tests only)")
    highest = max(
        (version(packages[i]["rust_version"]) for i in built if packages[i].get("rust_version")),
        default=(0, 0, 0),
    )
    print(f"{me}: rust-version {ours}; its {len(built)} dependencies need at most {'.'.join(map(str, highest))}")
sys.exit(1 if failed else 0)
PY

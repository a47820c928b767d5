#!/usr/bin/env bash
# The layers of src/ and what may import what, checked: every `crate::<module>` path in the
# code (not in comments) is an edge from the top module of its file to that module. An edge the
# table below does not allow fails the check. ARCHITECTURE.md describes the same layers.
#
#   scripts/imports.sh          check, and print nothing but what is wrong
#   scripts/imports.sh --list   print every edge with its count, then check
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 - "$@" <<'EOF'
import re
import sys
from collections import Counter
from pathlib import Path

# What each top module may import from the crate, besides itself. Lower layers first.
ALLOWED = {
    "error": set(),
    "hex": set(),
    "store": {"error", "hex"},
    "metrics": {"store", "error", "hex"},
    "engine": {"store", "metrics", "error", "hex"},
    "http": {"engine", "store", "metrics", "error", "hex"},
    "message": {"engine", "store", "metrics", "error", "hex"},
    # The outbound door's HTTP client sends the HTTP door's key header and records by its list
    # of fields never recorded. No door imports the outbound door.
    "outbound": {"http", "engine", "store", "metrics", "error", "hex"},
    "transactional": {"engine", "store", "metrics", "error", "hex"},
    "conformance": {"engine", "store", "metrics", "error", "hex"},
}

src = Path("src")


def top_of(path: Path) -> str | None:
    parts = path.relative_to(src).parts
    if parts == ("lib.rs",):
        return None  # the crate root re-exports every layer
    return parts[0].removesuffix(".rs")


# `crate::Name` paths go through the root's re-exports: read them from lib.rs.
root_names = {}
lib = (src / "lib.rs").read_text()
for m in re.finditer(r"pub use crate::(\w+)::([^;]+);", lib):
    module, rest = m.group(1), m.group(2)
    for name in re.findall(r"\b([A-Z]\w*)\b", rest):
        root_names[name] = module

edges = Counter()
wrong = []
for path in sorted(src.rglob("*.rs")):
    top = top_of(path)
    if top is None:
        continue
    if top not in ALLOWED:
        wrong.append(f"{path}: module `{top}` is not in scripts/imports.sh's table")
        continue
    for no, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("//", 1)[0]
        # `$crate::` in a macro names the user's path to the crate, not a module edge.
        names = re.findall(r"(?<!\$)\bcrate::(\w+)", code)
        # `use crate::{a::X, b::Y}`: each part is a path of its own.
        for group in re.findall(r"(?<!\$)\bcrate::\{([^}]*)\}", code):
            names += re.findall(r"(?:^|,)\s*(\w+)", group)
        for name in names:
            target = root_names.get(name, name)
            if target == top or not target[0].islower():
                continue
            edges[(top, target)] += 1
            if target not in ALLOWED[top]:
                wrong.append(f"{path}:{no}: {top} -> {target}: {line.strip()}")

if "--list" in sys.argv[1:]:
    for (a, b), n in sorted(edges.items()):
        print(f"{a} -> {b}: {n}")

if wrong:
    print("imports the layers forbid (see ARCHITECTURE.md):", file=sys.stderr)
    for w in wrong:
        print("  " + w, file=sys.stderr)
    sys.exit(1)
EOF

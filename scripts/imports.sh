#!/usr/bin/env bash
# The layers of src/ and what may import what, checked: every `crate::<module>` path in the
# code (not in comments) is an edge from the top module of its file to that module, each part of
# a `crate::{..}` group too, nested or over several lines. An edge the table below does not allow
# fails the check. ARCHITECTURE.md describes the same layers. The check first runs on a small
# tree of its own, so a way of writing an import it would miss fails it too.
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
    # The spans every door and the store timer open: names and fields, nothing above the store.
    "trace": {"store", "error", "hex"},
    "metrics": {"trace", "store", "error", "hex"},
    "engine": {"trace", "store", "metrics", "error", "hex"},
    "http": {"trace", "engine", "store", "metrics", "error", "hex"},
    "message": {"trace", "engine", "store", "metrics", "error", "hex"},
    # The outbound door's HTTP client sends the HTTP door's key header and records by its list
    # of fields never recorded. No door imports the outbound door.
    "outbound": {"trace", "http", "engine", "store", "metrics", "error", "hex"},
    "transactional": {"trace", "engine", "store", "metrics", "error", "hex"},
    # The webhook door's senders check a request's signature before the HTTP door claims it.
    "webhook": {"trace", "http", "engine", "store", "metrics", "error", "hex"},
    "conformance": {"trace", "engine", "store", "metrics", "error", "hex"},
}

src = Path("src")


# `crate::Name` paths go through the root's re-exports: read them from lib.rs.
root_names = {}
lib = (src / "lib.rs").read_text()
for m in re.finditer(r"pub use crate::(\w+)::([^;]+);", lib):
    module, rest = m.group(1), m.group(2)
    for name in re.findall(r"\b([A-Z]\w*)\b", rest):
        root_names[name] = module

def crate_paths(code: str):
    """Each `crate::<module>` a file names, with the offset where it is named. A group
    `crate::{a::X, b::{Y, Z}}` names each of its parts, over as many lines as it spans."""
    # `$crate::` in a macro names the user's path to the crate, not a module edge.
    for m in re.finditer(r"(?<!\$)\bcrate::(\w+|\{)", code):
        if m.group(1) != "{":
            yield m.group(1), m.start()
            continue
        depth, part, i = 1, True, m.end()
        while i < len(code) and depth:
            c = code[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c == "," and depth == 1:
                part = True
            elif part and not c.isspace():
                part = False
                name = re.match(r"\w+", code[i:])
                if name and depth == 1:
                    yield name.group(0), i
            i += 1


def lines_of(text: str) -> list[str]:
    """The file's lines with their `//` comments blanked out, so offsets stay put."""
    out = []
    for line in text.split("\n"):
        cut = line.find("//")
        out.append(line if cut < 0 else line[:cut] + " " * (len(line) - cut))
    return out


def check(root: Path, allowed: dict, root_names: dict):
    edges = Counter()
    wrong = []
    for path in sorted(root.rglob("*.rs")):
        parts = path.relative_to(root).parts
        if parts == ("lib.rs",):
            continue  # the crate root re-exports every layer
        top = parts[0].removesuffix(".rs")
        if top not in allowed:
            wrong.append(f"{path}: module `{top}` is not in scripts/imports.sh's table")
            continue
        raw = path.read_text().split("\n")
        code = "\n".join(lines_of("\n".join(raw)))
        for name, at in crate_paths(code):
            target = root_names.get(name, name)
            if target == top or not target[0].islower():
                continue
            edges[(top, target)] += 1
            if target not in allowed[top]:
                no = code.count("\n", 0, at) + 1
                wrong.append(f"{path}:{no}: {top} -> {target}: {raw[no - 1].strip()}")
    return edges, wrong


def self_test():
    """The checker on a small tree of its own: each import the table refuses must be found,
    however it is written."""
    import tempfile

    allowed = {"store": set(), "engine": {"store"}}
    cases = {
        "one line": "use crate::engine::Engine;\n",
        "a group": "use crate::{store::Key, engine::Engine};\n",
        "a group over lines": "use crate::{\n    store::Key,\n    engine::Engine,\n};\n",
        "a nested group": "use crate::{store::{A, B}, engine::Engine};\n",
        "a path in code": "fn f() { crate::engine::go(); }\n",
    }
    failed = []
    for what, text in cases.items():
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "store").mkdir()
            (root / "store" / "x.rs").write_text("// crate::engine in a comment\n" + text)
            _, wrong = check(root, allowed, {})
            if len(wrong) != 1 or "store -> engine" not in wrong[0]:
                failed.append(f"{what}: {wrong}")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "engine.rs").write_text("use crate::{\n    store::{A, B},\n};\n// crate::http\n")
        _, wrong = check(root, allowed, {})
        if wrong:
            failed.append(f"allowed imports refused: {wrong}")
    if failed:
        print("scripts/imports.sh checks itself and misses:", file=sys.stderr)
        for f in failed:
            print("  " + f, file=sys.stderr)
        sys.exit(1)


self_test()
edges, wrong = check(src, ALLOWED, root_names)

if "--list" in sys.argv[1:]:
    for (a, b), n in sorted(edges.items()):
        print(f"{a} -> {b}: {n}")

if wrong:
    print("imports the layers forbid (see ARCHITECTURE.md):", file=sys.stderr)
    for w in wrong:
        print("  " + w, file=sys.stderr)
    sys.exit(1)
EOF

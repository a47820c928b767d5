#!/usr/bin/env bash
# The README and the crate page share blocks: each is a file under src/docs/, included by
# src/lib.rs, and carried byte for byte in the README between
#   <!-- shared: src/docs/<file>.md -->   and   <!-- end shared -->
#
#   scripts/readme.sh        check: fails when a README block differs from its file
#   scripts/readme.sh --fix  rewrite the README's blocks from the files
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 - "$@" <<'PY'
import re
import sys
from pathlib import Path

readme = Path("README.md")
text = readme.read_text()
pattern = re.compile(r"<!-- shared: (\S+) -->\n(.*?)<!-- end shared -->\n", re.S)
lib = Path("src/lib.rs").read_text()
wrong = []
blocks = 0


def replace(m):
    global blocks
    blocks += 1
    path, body = m.group(1), m.group(2)
    source = Path(path)
    if not source.is_file():
        wrong.append(f"{path}: no such file")
        return m.group(0)
    if f'include_str!("{source.relative_to("src")}")' not in lib:
        wrong.append(f"{path}: src/lib.rs does not include it")
    want = source.read_text()
    if body != want:
        wrong.append(f"{path}: the README's copy differs (scripts/readme.sh --fix)")
    return f"<!-- shared: {path} -->\n{want}<!-- end shared -->\n"


fixed = pattern.sub(replace, text)
if blocks == 0:
    wrong.append("README.md: no shared block")
if "--fix" in sys.argv[1:]:
    readme.write_text(fixed)
    wrong = [w for w in wrong if "differs" not in w]
if wrong:
    for w in wrong:
        print(w, file=sys.stderr)
    sys.exit(1)
PY

#!/usr/bin/env python3
"""Self (exclusive) instruction counts per function from a callgrind output file, grouped by
function name (inlined code counts toward the function it was inlined into).

    loadtest/callgrind_self.py CALLGRIND_FILE [TOP] [REQUESTS]
"""
import re
import sys
from collections import defaultdict

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
requests = int(sys.argv[3]) if len(sys.argv) > 3 else 0
names = {}
self_cost = defaultdict(int)
fn = None
skip_next = False
total = 0
for line in open(path, errors="replace"):
    line = line.rstrip("\n")
    if line.startswith("cfn="):
        m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line)
        if m and m.group(2):
            names[m.group(1)] = m.group(2)
        continue
    if line.startswith("fn="):
        m = re.match(r"fn=\((\d+)\)(?: (.*))?", line)
        if m.group(2):
            names[m.group(1)] = m.group(2)
        fn = m.group(1)
        continue
    if line.startswith("calls="):
        skip_next = True
        continue
    if line and (line[0].isdigit() or line[0] in "+-*"):
        if skip_next:
            skip_next = False
            continue
        parts = line.split()
        if len(parts) >= 2 and fn is not None:
            try:
                c = int(parts[1])
            except ValueError:
                continue
            self_cost[fn] += c
            total += c
        continue
    if line.startswith("totals:"):
        pass
self_cost = {names.get(k, k): v for k, v in self_cost.items()}
merged = defaultdict(int)
for k, v in self_cost.items():
    merged[k] += v
self_cost = merged
rows = sorted(self_cost.items(), key=lambda kv: -kv[1])[:top]
print(f"total self instructions: {total:,}" + (f"  ({total // requests:,} per request)" if requests else ""))
for name, c in rows:
    per = f"{c // requests:>8,}/req  " if requests else ""
    print(f"{c:>14,} {100.0 * c / total:5.1f}%  {per}{name[:150]}")

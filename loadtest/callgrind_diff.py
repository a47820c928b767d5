#!/usr/bin/env python3
"""Self (exclusive) instructions per request, function by function, of two callgrind dumps:
two rows (a row against bare or the floor), or one row in two builds. Largest differences
first; inlined code counts toward the function it was inlined into.

    loadtest/callgrind_diff.py BASE_FILE BASE_REQUESTS OTHER_FILE OTHER_REQUESTS [TOP]

Then the same difference in parts: SHA-256, the allocator, memory copies, the store, the rest
of the crate, the Redis client, and what is left (hyper, axum, tokio, the handler).
"""
import re
import sys
from collections import defaultdict


def self_costs(path):
    names, cost = {}, defaultdict(int)
    fn, skip = None, False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith(("cfn=", "fn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("fn="):
                fn = m.group(1)
            continue
        if line.startswith("calls="):
            skip = True
            continue
        if line and (line[0].isdigit() or line[0] in "+-*"):
            if skip:
                skip = False
                continue
            parts = line.split()
            if len(parts) >= 2 and fn is not None:
                try:
                    cost[fn] += int(parts[1])
                except ValueError:
                    pass
    merged = defaultdict(int)
    for k, v in cost.items():
        merged[names.get(k, k)] += v
    return merged


base_file, base_n, other_file, other_n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
top = int(sys.argv[5]) if len(sys.argv) > 5 else 40
a = {k: v / base_n for k, v in self_costs(base_file).items()}
b = {k: v / other_n for k, v in self_costs(other_file).items()}
ta, tb = sum(a.values()), sum(b.values())
print(f"per request: base {ta:,.0f}, other {tb:,.0f}, difference {tb - ta:+,.0f}")
rows = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:top]
print(f"{'base':>9} {'other':>9} {'diff':>9}  function")
for k in rows:
    x, y = a.get(k, 0), b.get(k, 0)
    print(f"{x:>9,.0f} {y:>9,.0f} {y - x:>+9,.0f}  {k[:140]}")

GROUPS = [
    ("SHA-256: fingerprint and store key", r"^sha2::|FingerprintBuilder|scope::lp\b|StoreKey::derive|Config::fingerprint"),
    ("allocator: malloc, free", r"^(malloc|free|cfree|realloc|_int_malloc|_int_free|_int_realloc|malloc_consolidate|unlink_chunk.*|tcache.*)$"),
    ("memory copies: memcpy, memmove", r"^__mem(cpy|move|set)"),
    ("the store", r"tower_idempotency::store::"),
    ("the rest of the crate", r"tower_idempotency::|tokio_util::task::task_tracker"),
    ("the Redis client", r"^<?redis::"),
    ("tracing", r"^<?tracing"),
]


def group(name):
    for g, pattern in GROUPS:
        if re.search(pattern, name):
            return g
    return "the rest: hyper, axum, http, tokio, the handler"


ga, gb = defaultdict(float), defaultdict(float)
for k, v in a.items():
    ga[group(k)] += v
for k, v in b.items():
    gb[group(k)] += v
print(f"\n{'base':>9} {'other':>9} {'diff':>9}  part")
for g in [g for g, _ in GROUPS] + ["the rest: hyper, axum, http, tokio, the handler"]:
    print(f"{ga[g]:>9,.0f} {gb[g]:>9,.0f} {gb[g] - ga[g]:>+9,.0f}  {g}")

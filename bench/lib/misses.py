#!/usr/bin/env python3
"""Simulated cache misses a callgrind profile (run with --cache-sim=yes) recorded, per request:
first-level instruction misses (I1mr), data read and write misses (D1mr, D1mw), in all and by the
function they happened in (exclusive: a function's own instructions, not its callees').

valgrind's cache model is the host's first and last level caches as it reads them, without
prefetching: read the figures as where a request touches memory it has not touched lately, and
compare builds with each other or with nginx counted the same way, not with cycles.

Usage: misses.py CALLGRIND_OUT REQUESTS [TOP]
"""
import collections
import re
import sys

NAMED = re.compile(r"(c?fn)=\((\d+)\)(?: (.*))?$")
SHOWN = ("I1mr", "D1mr", "D1mw")


def by_function(path):
    """The event names, and each function's own costs (one list per function)."""
    names, costs = {}, collections.defaultdict(lambda: None)
    events, fn, skip_next = [], None, False
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
                continue
            m = NAMED.match(line)
            if m:
                kind, index, name = m.groups()
                if name is not None:
                    names[index] = name
                if kind == "fn":
                    fn = names[index]
                continue
            if line.startswith("calls="):
                # The next cost line is the call's inclusive cost, not this function's own.
                skip_next = True
                continue
            if not line or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            if skip_next:
                skip_next = False
                continue
            values = [int(v) for v in line.split()[1:]]
            own = costs[fn] or [0] * len(events)
            for i, v in enumerate(values):
                own[i] += v
            costs[fn] = own
    return events, costs


def main():
    path, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    events, costs = by_function(path)
    missing = [e for e in SHOWN if e not in events]
    if missing:
        sys.exit(f"{path}: no {', '.join(missing)} (was callgrind run with --cache-sim=yes?)")
    at = {e: events.index(e) for e in SHOWN}
    totals = {e: sum(c[at[e]] for c in costs.values()) for e in SHOWN}
    print("  ".join(f"{totals[e] / requests:.0f} {e}" for e in SHOWN) + " per request")
    for e in SHOWN:
        if top == 0:
            break
        print(f"  by {e}:")
        ranked = sorted(costs.items(), key=lambda kv: -kv[1][at[e]])[:top]
        for fn, c in ranked:
            print(f"    {c[at[e]] / requests:7.1f}  {fn[:130]}")


if __name__ == "__main__":
    main()

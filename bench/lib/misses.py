#!/usr/bin/env python3
"""Simulated cache misses a callgrind profile (run with --cache-sim=yes) recorded, per request:
first-level instruction misses (I1mr), data read and write misses (D1mr, D1mw), in all and by the
function they happened in (exclusive: a function's own instructions, not its callees').

valgrind's cache model is the host's first and last level caches as it reads them, without
prefetching: read the figures as where a request touches memory it has not touched lately, and
compare builds with each other or with nginx counted the same way, not with cycles.

Usage: misses.py CALLGRIND_OUT REQUESTS [TOP]
"""
import sys

from locked import costs

SHOWN = ("I1mr", "D1mr", "D1mw")


def events(path):
    """The event names of a callgrind file, in the order of its cost columns."""
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                return line.split()[1:]
    return []


def by_function(path):
    """Each function's own costs (a list per function, in the order of `events`)."""
    own = {}
    for _, _, fn, values in costs(path):
        sums = own.setdefault(fn, [0] * len(values))
        for i, v in enumerate(values):
            sums[i] += v
    return own


def main():
    path, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    names, own = events(path), by_function(path)
    missing = [e for e in SHOWN if e not in names]
    if missing:
        sys.exit(f"{path}: no {', '.join(missing)} (was callgrind run with --cache-sim=yes?)")
    at = {e: names.index(e) for e in SHOWN}
    totals = {e: sum(c[at[e]] for c in own.values()) for e in SHOWN}
    print("  ".join(f"{totals[e] / requests:.0f} {e}" for e in SHOWN) + " per request")
    for e in SHOWN:
        if top == 0:
            break
        print(f"  by {e}:")
        ranked = sorted(own.items(), key=lambda kv: -kv[1][at[e]])[:top]
        for fn, c in ranked:
            print(f"    {c[at[e]] / requests:7.1f}  {fn[:130]}")


if __name__ == "__main__":
    main()

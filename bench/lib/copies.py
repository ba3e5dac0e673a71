#!/usr/bin/env python3
"""Calls to glibc's memcpy and memmove a callgrind profile made, per request, and the functions
that made them.

Most are not copies of data but moves of values and futures: on the baseline x86-64 target the
compiler moves a value of up to 128 bytes with its own loads and stores, and calls memcpy for a
larger one (and for a length it does not know). Each such call is some 30 instructions of
glibc's and the value's bytes read and written again.

Usage: copies.py CALLGRIND_OUT REQUESTS [TOP]
Output: the calls a request and the instructions run in them, then the TOP calling functions
(as callgrind names them: with what is inlined into them), by calls.
"""
import collections
import re
import sys

NAMED = re.compile(r"(c?fn)=\((\d+)\)(?: (.*))?$")
COPY = re.compile(r"__(memcpy|memmove)\w*|^(memcpy|memmove)$")


def calls_to_copies(path):
    """{caller: [calls, inclusive instructions]} of the calls to memcpy and memmove in `path`."""
    names = {}
    by_caller = collections.defaultdict(lambda: [0, 0])
    fn = None
    target = None
    pending = None
    positions = 1
    with open(path) as f:
        for line in f:
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
                continue
            if pending is not None:
                # The line after `calls=` is the call's positions and its inclusive costs, Ir
                # first.
                by_caller[fn][0] += pending
                by_caller[fn][1] += int(line.split()[positions])
                pending = None
                continue
            m = NAMED.match(line)
            if m:
                kind, index, name = m.groups()
                if name is not None:
                    names[index] = name
                if kind == "fn":
                    fn = names.get(index, index)
                else:
                    target = names.get(index, index)
                continue
            if line.startswith("calls="):
                if target is not None and COPY.search(target):
                    pending = int(line.split("=")[1].split()[0])
                target = None
    return by_caller


def main():
    path, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    by_caller = calls_to_copies(path)
    calls = sum(c for c, _ in by_caller.values())
    instructions = sum(i for _, i in by_caller.values())
    print(f"{calls / requests:.1f} calls to memcpy or memmove per request "
          f"({instructions / requests:.0f} instructions in them)")
    for caller, (c, i) in sorted(by_caller.items(), key=lambda kv: -kv[1][0])[:top]:
        if c / requests >= 0.05:
            print(f"  {c / requests:6.2f} {i / max(c, 1):6.0f} a call  {caller[:110]}")


if __name__ == "__main__":
    main()

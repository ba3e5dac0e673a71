#!/usr/bin/env python3
"""Inclusive time per function in a `perf record -g` of spillway (each function counted once
per sample it is on the stack of, inlined frames included), and who calls a given symbol.

Usage:
  perf_inclusive.py PERF_DATA [REGEX] [TOP]      functions matching REGEX (default: spillway's
                                                 own), by share of samples on whose stack they are
  perf_inclusive.py PERF_DATA --callers LEAF_REGEX [CALLER_REGEX] [TOP]
                                                 samples whose leaf matches LEAF_REGEX, by the
                                                 nearest frame matching CALLER_REGEX
"""
import collections
import re
import subprocess
import sys


def short(name):
    """A frame's name without generic arguments and `(inlined)`."""
    name = name.replace(" (inlined)", "")
    prev = None
    while prev != name:
        prev = name
        name = re.sub(r"(\w)<[^<>]*>", r"\1", name)
    return name


def samples(data):
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"],
                         capture_output=True, text=True, check=True).stdout
    frames = []
    for line in out.splitlines():
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        parts = line.strip().split(None, 1)
        frames.append(short(parts[1]) if len(parts) > 1 else "[unknown]")
    if frames:
        yield frames


def main():
    args = sys.argv[1:]
    data = args.pop(0)
    every = list(samples(data))
    total = len(every)
    print(f"samples: {total}")
    if args and args[0] == "--callers":
        leaf = re.compile(args[1])
        caller = re.compile(args[2] if len(args) > 2 else r"spillway_|hyper|axum|tokio")
        top = int(args[3]) if len(args) > 3 else 30
        counts = collections.Counter()
        matched = 0
        for frames in every:
            if not leaf.search(frames[0]):
                continue
            matched += 1
            found = next((f for f in frames[1:] if caller.search(f)), "[none]")
            counts[found] += 1
        print(f"leaf /{leaf.pattern}/: {100 * matched / total:.2f}% of samples")
        for name, n in counts.most_common(top):
            print(f"  {100 * n / total:6.2f}%  {name[:150]}")
        return
    pattern = re.compile(args[0] if args else r"spillway_")
    top = int(args[1]) if len(args) > 1 else 60
    counts = collections.Counter()
    for frames in every:
        for name in set(frames):
            if pattern.search(name):
                counts[name] += 1
    for name, n in counts.most_common(top):
        print(f"  {100 * n / total:6.2f}%  {name[:150]}")


if __name__ == "__main__":
    main()

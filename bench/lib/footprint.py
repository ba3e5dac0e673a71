#!/usr/bin/env python3
"""The code a request runs through: from a callgrind profile with instruction positions, the
instructions run about once a request or more (at least 0.9 times the request count), their
bytes and the 64-byte cache lines they lie in, per object file and by function.

At one connection a request starts on caches the load generator and the backend have used
since the last one, so the lines it runs through are fetched again: the number of lines, more
than the instructions run, is what a request's code costs there. Utilisation is the share of
those lines' bytes that are run (the rest: code beside it that this request does not take).

Pages are the 4 KiB pages those lines lie in: each a translation the CPU looks up, and walks the
page tables for (twice over in a virtual machine) when its caches no longer hold it.

Usage: footprint.py CALLGRIND_OUT REQUESTS [TOP]   (CALLGRIND_OUT written with --dump-instr=yes)
"""
import collections
import re
import subprocess
import sys

from locked import costs

LINE = 64
PAGE = 4096
INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):")


def sizes(path):
    """Each instruction's size in the ELF file at `path`, by address (from the next one's)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                         capture_output=True, text=True).stdout
    found, last = {}, None
    for m in map(INSTRUCTION.match, out.splitlines()):
        if not m:
            continue
        at = int(m.group(1), 16)
        if last is not None and 0 < at - last <= 15:
            found[last] = at - last
        last = at
    return found


def main():
    out, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    runs = collections.Counter()
    named = {}
    for ob, addr, fn, values in costs(out):
        runs[(ob, addr)] += values[0]
        named.setdefault((ob, addr), fn)
    every = [key for key, n in runs.items() if n >= 0.9 * requests]
    by_object = collections.defaultdict(list)
    for ob, addr in every:
        by_object[ob].append(addr)
    by_fn = collections.Counter()
    total_bytes = total_lines = total_pages = 0
    for ob, addrs in sorted(by_object.items(), key=lambda kv: -len(kv[1])):
        size = sizes(ob) if ob and ob.startswith("/") else {}
        lines = collections.Counter()
        for addr in addrs:
            n = size.get(addr, 4)
            lines[addr // LINE] += n
            by_fn[named[(ob, addr)]] += n
        run = sum(lines.values())
        pages = len({line * LINE // PAGE for line in lines})
        total_bytes += run
        total_lines += len(lines)
        total_pages += pages
        print(f"{len(addrs):7d} instructions {run:8d} bytes {len(lines):6d} lines {pages:4d} pages "
              f"(utilisation {run / (LINE * len(lines)):.2f})  {ob}")
    print(f"in all: {total_bytes} bytes of code in {total_lines} lines and {total_pages} pages "
          "run on a request")
    for fn, n in by_fn.most_common(top):
        print(f"  {n:7d}  {fn[:150]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Locked read-modify-writes (x86 `lock`-prefixed instructions and `xchg` with memory) a callgrind
profile executed, per request, and the functions that ran them.

Instruction counts treat an atomic addition like any other instruction; on this kind of machine
one costs some 20 cycles or more (perf's samples pile up on them), so they are counted apart.

Usage: locked.py CALLGRIND_OUT REQUESTS [TOP [SITES]]   (CALLGRIND_OUT written with
  --dump-instr=yes; SITES: also the SITES instructions run most, each with its source lines,
  inlined callers included)
Output: the count a request, then by origin (glibc, tokio, bytes, spillway's own with what is
inlined into it, other), then the TOP functions.
"""
import collections
import re
import subprocess
import sys


def locked_addresses(path):
    """Addresses (as the ELF file gives them, as callgrind writes them) of the locked
    instructions in `path`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                         capture_output=True, text=True).stdout
    pattern = re.compile(r"^\s*([0-9a-f]+):\s+(lock\b|xchg\s+\S*\(|xchg\s+%\w+,\S*\()")
    return {int(m.group(1), 16) for m in map(pattern.match, out.splitlines()) if m}


NAMED = re.compile(r"c?(ob|fn)=\((\d+)\)(?: (.*))?$")


def number(text):
    """A callgrind number: hexadecimal after `0x`, decimal otherwise."""
    return int(text, 16) if text.startswith("0x") else int(text)


def costs(path):
    """(object, instruction address, function, costs) of each cost line, call lines' inclusive
    costs left out; costs are the file's events in order (`events:`), Ir first. The address is
    the first position when the file has instruction positions (`--dump-instr=yes`), else a
    line number."""
    names = {}
    objects = {}
    ob = fn = None
    addr = 0
    positions, width = 1, 1
    skip_next = False
    with open(path) as f:
        for line in f:
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
                continue
            if line.startswith("events:"):
                width = len(line.split()) - 1
                continue
            m = NAMED.match(line)
            if m:
                # A name is given with its number the first time; `cob=`/`cfn=` name a call's
                # target, `ob=`/`fn=` the lines that follow.
                kind, index, name = m.groups()
                table = objects if kind == "ob" else names
                if name is not None:
                    table[index] = name
                if not line.startswith("c"):
                    if kind == "ob":
                        ob = table[index]
                    else:
                        fn = table[index]
                continue
            if line.startswith("calls="):
                skip_next = True
                continue
            if not line or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            parts = line.split()
            a = parts[0]
            if a == "*":
                pass
            elif a[0] in "+-":
                addr += number(a[1:]) * (1 if a[0] == "+" else -1)
            else:
                addr = number(a)
            if skip_next:
                skip_next = False
                continue
            # Trailing events that cost nothing may be left out of a line.
            values = [int(v) for v in parts[positions:]]
            if values:
                yield ob, addr, fn, values + [0] * (width - len(values))


def origin(ob, fn):
    """Whose code ran a locked instruction: the C library, tokio, `bytes`, spillway's own (what
    is inlined into its functions, its `Arc`s and mutexes, counts as its own) or another crate."""
    if ob and "/libc" in ob:
        return "glibc"
    # The runtime's loop is inlined into spillway's `run`.
    if fn.startswith("tokio::") or fn.startswith("<tokio::") or fn == "spillway::run":
        return "tokio"
    if fn.startswith("bytes::"):
        return "bytes"
    if "spillway" in fn or "arc_swap" in fn:
        return "spillway"
    return "other"


def main():
    out, requests = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    sites = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    locked = {}
    total = 0
    by_fn = collections.Counter()
    by_site = collections.Counter()
    fnof = {}
    for ob, addr, fn, values in costs(out):
        n = values[0]
        if ob not in locked:
            locked[ob] = locked_addresses(ob) if ob and ob.startswith("/") else set()
        if addr in locked[ob]:
            total += n
            by_fn[fn] += n
            by_site[(ob, addr)] += n
            fnof[(ob, addr)] = fn or ""
    print(f"{total / requests:.1f} locked instructions per request")
    by_origin = collections.Counter()
    for site, n in by_site.items():
        by_origin[origin(site[0], fnof[site])] += n
    print("  by origin: " + ", ".join(f"{name} {n / requests:.1f}"
                                      for name, n in by_origin.most_common()))
    for fn, n in by_fn.most_common(top):
        print(f"  {n / requests:6.2f}  {fn[:150]}")
    for (ob, addr), n in by_site.most_common(sites):
        lines = subprocess.run(["addr2line", "-e", ob, "-i", hex(addr)],
                               capture_output=True, text=True).stdout.split()
        # The innermost line, then the first two in this repository's crates.
        ours = [line for line in lines if "/crates/" in line and "/registry/" not in line]
        shown = lines[:1] + ours[:2]
        where = " < ".join("/".join(line.split("/")[-2:]) for line in shown)
        print(f"  {n / requests:6.2f}  {ob.split('/')[-1]} {where}")


if __name__ == "__main__":
    main()

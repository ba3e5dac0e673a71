#!/usr/bin/env python3
"""The functions a request runs through, hottest first, as the linker's symbol ordering file
takes them: from a callgrind profile with instruction positions (`bench/instructions.sh
KEEP=DIR FOOTPRINT=1`) of BINARY, every function of BINARY with an instruction run about once a
request or more (at least 0.9 times the request count), by its symbol name in BINARY (`nm`),
ordered by the instructions it runs a request.

Laid out together at the start of the code, these take a few dozen pages rather than some two
hundred spread over the binary's 16 MB of code: fewer translation look-aside misses and page
walks at each request, which at one connection starts on caches and TLBs the load generator and
the backend have used since the last one.

Usage: hot_symbols.py CALLGRIND_OUT REQUESTS BINARY > crates/spillway/hot-symbols.txt
"""
import bisect
import collections
import subprocess
import sys

from locked import costs


def symbols(path):
    """The defined function symbols of the ELF file at `path`: sorted start addresses and names."""
    out = subprocess.run(["nm", "--defined-only", "-n", path],
                         capture_output=True, text=True, check=True).stdout
    starts, names = [], []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            starts.append(int(parts[0], 16))
            names.append(parts[2])
    return starts, names


def main():
    out, requests, binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    runs = collections.Counter()
    for ob, addr, _fn, values in costs(out):
        if ob and ob.endswith(binary.rsplit("/", 1)[-1]):
            runs[addr] += values[0]
    starts, names = symbols(binary)
    by_symbol = collections.Counter()
    for addr, n in runs.items():
        if n < 0.9 * requests:
            continue
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0:
            by_symbol[names[i]] += n
    for name, _ in by_symbol.most_common():
        print(name)
        if "11compress256" in name:
            # valgrind runs SHA-256's software form; natively the CPU's SHA instructions run it,
            # in `sha2::sha256::x86::digest_blocks`.
            for other in names:
                if "sha2563x8613digest_blocks" in other:
                    print(other)


if __name__ == "__main__":
    main()

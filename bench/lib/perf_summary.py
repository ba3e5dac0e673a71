#!/usr/bin/env python3
"""Summarise a `perf record` of spillway: the top symbols by self time, and self time grouped
by where it is spent (kernel, hyper, tokio, the gateway's own code, allocation, metrics, ...).

Usage: perf_summary.py PERF_DATA [TOP]   (TOP symbols listed, default 40)
"""
import re
import subprocess
import sys

# First match wins: a symbol is counted in one group only.
GROUPS = [
    ("kernel", lambda s, k: k),
    ("allocation", lambda s, k: re.match(r"(_?mi_|mi_|__libc_malloc|malloc|free|cfree|realloc|"
                                         r"__rust_(alloc|dealloc|realloc)|alloc::alloc::)", s)),
    ("memcpy/memmove", lambda s, k: re.search(r"mem(move|cpy|set|cmp)", s)),
    ("clock reads", lambda s, k: re.search(r"clock_gettime|Timespec>::now|Instant>::now", s)),
    ("metrics", lambda s, k: re.search(r"\bmetrics(_util|_exporter_prometheus)?::", s)),
    ("tracing", lambda s, k: re.search(r"\btracing(_core|_subscriber)?::", s)),
    ("serde_json", lambda s, k: "serde_json::" in s or "serde_core::" in s),
    ("moka (key cache)", lambda s, k: "moka::" in s or "crossbeam" in s),
    ("spillway", lambda s, k: "spillway_" in s),
    ("hyper / hyper-util / h2", lambda s, k: re.search(r"\b(hyper|hyper_util|h2|httparse)::", s)
        or "httparse" in s),
    ("http / bytes", lambda s, k: re.search(r"\b(http|bytes|http_body|http_body_util)::", s)),
    ("axum / tower", lambda s, k: re.search(r"\b(axum|axum_core|tower|tower_service)::", s)),
    ("tokio / mio", lambda s, k: re.search(r"\b(tokio|mio)::", s)),
    ("futures", lambda s, k: "futures_util::" in s or "futures_core::" in s),
    ("libc (syscall wrappers, locks)", lambda s, k: re.match(r"(__GI_|__libc|__lll|pthread|"
                                                            r"__pthread|__writev|__recv|__send|"
                                                            r"epoll|syscall)", s)),
    ("std / core", lambda s, k: re.search(r"\b(std|core|alloc)::", s)),
]


def main():
    data = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio",
         "-g", "none"],
        capture_output=True, text=True, check=True).stdout
    rows = []
    samples = None
    for line in out.splitlines():
        m = re.match(r"# Samples: (\S+)", line)
        if m:
            samples = m.group(1)
        m = re.match(r"\s+([\d.]+)%\s+\[(.)\]\s+(.*?)\s*$", line)
        if m:
            sym = re.sub(r"\s+-\s+-\s*$", "", m.group(3)).strip()
            rows.append((float(m.group(1)), m.group(2) == "k", sym))
    totals = {}
    for pct, kernel, sym in rows:
        group = next((g for g, test in GROUPS if test(sym, kernel)), "other")
        totals[group] = totals.get(group, 0.0) + pct
    print(f"samples: {samples}")
    print("\nself time by group:")
    for group, pct in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {pct:6.2f}%  {group}")
    print(f"\ntop {top} symbols (self):")
    for pct, kernel, sym in rows[:top]:
        print(f"  {pct:6.2f}%  [{'k' if kernel else 'u'}] {sym[:130]}")


if __name__ == "__main__":
    main()

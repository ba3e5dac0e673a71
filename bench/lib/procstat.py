#!/usr/bin/env python3
"""Snapshot CPU time and memory of process trees (root PIDs + all descendants).

Usage: procstat.py NAME=PID[,PID...] [NAME=PID...]   -> one JSON line:
  {"NAME": {"cpu_s", "hwm_kb_sum", "hwm_kb_max", "rss_kb_sum", "nproc"}, ...,
   "sys_busy_s", "sys_total_s"}
cpu_s is utime+stime of the live processes of the tree (all threads), in
seconds; VmHWM is the peak RSS of each process; sys_* come from /proc/stat
(whole machine, for utilisation over an interval). A group whose PIDs are gone
reports nproc 0.
"""
import json
import os
import sys

TCK = os.sysconf("SC_CLK_TCK")


def children_map():
    m = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        m.setdefault(int(rest[1]), []).append(int(d))
    return m


def tree(roots, cm):
    out, stack = [], list(roots)
    while stack:
        p = stack.pop()
        if p in out:
            continue
        out.append(p)
        stack.extend(cm.get(p, []))
    return out


def proc_info(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    rest = s[s.rfind(")") + 2:].split()
    cpu = (int(rest[11]) + int(rest[12])) / TCK
    hwm = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return cpu, hwm, rss


def group(roots, cm):
    cpu, hwm, rss, n = 0.0, [], 0, 0
    for p in tree(roots, cm):
        try:
            c, h, r = proc_info(p)
        except (OSError, IndexError, ValueError):
            continue
        cpu += c
        hwm.append(h)
        rss += r
        n += 1
    return {"cpu_s": round(cpu, 3), "hwm_kb_sum": sum(hwm), "hwm_kb_max": max(hwm or [0]),
            "rss_kb_sum": rss, "nproc": n}


def sysstat():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / TCK, sum(v) / TCK


def main():
    cm = children_map()
    out = {}
    for arg in sys.argv[1:]:
        name, _, pids = arg.partition("=")
        roots = [int(p) for p in pids.split(",") if p.strip().isdigit()]
        out[name] = group(roots, cm)
    busy, total = sysstat()
    out["sys_busy_s"] = round(busy, 2)
    out["sys_total_s"] = round(total, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

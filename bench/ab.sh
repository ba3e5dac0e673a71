#!/usr/bin/env bash
# Paired A/B of two spillway binaries: bench/profile.sh MODE=stat runs of A and B back to back,
# the order alternating from pair to pair (A B, B A, A B, ...), so slow drift of a shared machine
# falls on both alike. Prints every run, then per figure (total, user and system CPU µs per
# request; wrk's p99 latency in µs) each binary's median and the median of the per-pair
# differences B - A, with how many pairs had B lower.
#
# Usage: bench/ab.sh A_BINARY B_BINARY
# Env (defaults): PAIRS=6, CONNS=64, DURATION=5, plus what bench/profile.sh reads
#   (BACKEND=down: every call refused, the outage path).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
A="${1:?A binary}"; B="${2:?B binary}"
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
PAIRS="${PAIRS:-6}"; export CONNS="${CONNS:-64}" DURATION="${DURATION:-5}" MODE=stat
OUT="$(mktemp)"; trap 'rm -f "$OUT"' EXIT

run() { # label binary pair
  local log
  log="$("$BENCH_DIR/profile.sh" --spillway "$2" 2>&1)" || { echo "$log" >&2; exit 1; }
  local user sys p99
  read -r user sys < <(echo "$log" | sed -n 's/^ *\([0-9.]*\) us user, \([0-9.]*\) us system per request.*/\1 \2/p')
  p99="$(echo "$log" | sed -n 's/.*"lat_p99_us":\([0-9.]*\).*/\1/p')"
  [ -n "$user" ] && [ -n "$p99" ] || { echo "no CPU or latency figures in bench/profile.sh's output:" >&2; echo "$log" >&2; exit 1; }
  echo "$1 $3 $user $sys $p99" >>"$OUT"
  printf 'pair %d %s: %s us user + %s us system per request, p99 %s us\n' "$3" "$1" "$user" "$sys" "$p99" >&2
}

for pair in $(seq 1 "$PAIRS"); do
  if [ $((pair % 2)) = 1 ]; then run A "$A" "$pair"; run B "$B" "$pair"
  else run B "$B" "$pair"; run A "$A" "$pair"; fi
done

python3 - "$OUT" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    label, pair, user, sys_, p99 = line.split()
    runs[(label, int(pair))] = (float(user), float(sys_), float(p99))
pairs = sorted({p for _, p in runs})
figures = {"total": lambda r: r[0] + r[1], "user": lambda r: r[0], "system": lambda r: r[1],
           "p99": lambda r: r[2]}
print(f"{len(pairs)} pairs, CPU us per request and p99 us (median A / median B; "
      "B - A per pair, median)")
for name, f in figures.items():
    a = [f(runs[("A", p)]) for p in pairs]
    b = [f(runs[("B", p)]) for p in pairs]
    d = [y - x for x, y in zip(a, b)]
    lower = sum(1 for x in d if x < 0)
    print(f"  {name:6} {statistics.median(a):6.2f} / {statistics.median(b):6.2f}; "
          f"B - A {statistics.median(d):+.2f} (B lower in {lower} of {len(d)}: "
          + ", ".join(f"{x:+.1f}" for x in d) + ")")
EOF

#!/usr/bin/env bash
# NGINX and spillway back to back under bench/profile.sh MODE=stat, alternating which goes first,
# to see how throughput follows the proxy's context switches: on two cores shared by wrk, the
# backend and the proxy, the kernel now and then gives the proxy's CPU to one of the others (an
# involuntary switch), and how often varies from run to run for either proxy. Prints every run
# (req/s, CPU, voluntary and involuntary switches a request), each proxy's medians, and a least
# squares fit of req/s on involuntary switches a request with a term for the proxy: that term
# is the difference between the two at equal preemption.
#
# Usage: bench/switches.sh [SPILLWAY_BINARY]   (default target/release/spillway)
# Env (defaults): PAIRS=6, CONNS=16, DURATION=5, plus what bench/profile.sh reads.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
BIN="${1:-$BENCH_DIR/../target/release/spillway}"
[ -x "$BIN" ] || { echo "not an executable: $BIN" >&2; exit 2; }
PAIRS="${PAIRS:-6}"; export CONNS="${CONNS:-16}" DURATION="${DURATION:-5}" MODE=stat
OUT="$(mktemp)"; trap 'rm -f "$OUT"' EXIT

run() { # target
  local log
  log="$(TARGET="$1" "$BENCH_DIR/profile.sh" --spillway "$BIN" 2>&1)" || { echo "$log" >&2; exit 1; }
  local rps cpu switches
  rps="$(echo "$log" | sed -n 's/.*"rps":\([0-9.]*\).*/\1/p')"
  cpu="$(echo "$log" | sed -n 's/^ *\([0-9.]*\) us CPU per request.*/\1/p')"
  switches="$(echo "$log" | sed -n 's/^ *\([0-9.]*\) voluntary, \([0-9.]*\) involuntary.*/\1 \2/p')"
  [ -n "$rps" ] && [ -n "$cpu" ] && [ -n "$switches" ] ||
    { echo "no figures in bench/profile.sh's output:" >&2; echo "$log" >&2; exit 1; }
  echo "$1 $rps $cpu $switches" | tee -a "$OUT" >&2
}

for pair in $(seq 1 "$PAIRS"); do
  if [ $((pair % 2)) = 1 ]; then run nginx; run spillway; else run spillway; run nginx; fi
done

python3 - "$OUT" "$CONNS" <<'PY'
import statistics, sys
rows = [(t, float(r), float(c), float(v), float(i))
        for t, r, c, v, i in (line.split() for line in open(sys.argv[1]))]
print(f"{sys.argv[2]} connections; target, req/s, CPU us/req, voluntary and involuntary switches/req")
for t in ("nginx", "spillway"):
    mine = [r for r in rows if r[0] == t]
    med = [statistics.median(r[k] for r in mine) for k in (1, 2, 3, 4)]
    print(f"{t:8} medians: {med[0]:8.0f} req/s  {med[1]:6.2f} us  {med[2]:.3f}  {med[3]:.3f}")
# req/s = a + b x involuntary + c x (spillway), by the normal equations
x = [(1.0, r[4], 1.0 if r[0] == "spillway" else 0.0) for r in rows]
y = [r[1] for r in rows]
m = [[sum(p[i] * p[j] for p in x) for j in range(3)] + [sum(p[i] * q for p, q in zip(x, y))]
     for i in range(3)]
for i in range(3):
    k = max(range(i, 3), key=lambda r: abs(m[r][i]))
    m[i], m[k] = m[k], m[i]
    if m[i][i] == 0:
        sys.exit("the fit needs runs of both proxies with different switch counts")
    for r in range(3):
        if r != i:
            f = m[r][i] / m[i][i]
            m[r] = [a - f * b for a, b in zip(m[r], m[i])]
a, b, c = (m[i][3] / m[i][i] for i in range(3))
inv = [r[4] for r in rows]
mi, my = statistics.mean(inv), statistics.mean(y)
den = (sum((v - mi) ** 2 for v in inv) * sum((v - my) ** 2 for v in y)) ** 0.5
corr = sum((v - mi) * (w - my) for v, w in zip(inv, y)) / den if den else float("nan")
print(f"fit: req/s = {a:.0f} {b:+.0f} x involuntary/req {c:+.0f} for spillway"
      f" ({100 * c / a:+.1f} % at no preemption); correlation of req/s with involuntary/req {corr:.2f}")
PY

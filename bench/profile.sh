#!/usr/bin/env bash
# Profile spillway under the benchmark's load: the mock backend, spillway with
# bench/spillway.toml and wrk, as bench/run.sh starts them (127.0.0.1 only, in a
# private network namespace when `unshare -n` is allowed), with `perf record`
# attached to spillway while wrk runs. Everything it starts is stopped by PID.
#
# Usage: bench/profile.sh [--spillway PATH]
# Env (defaults): CONNS=16 (wrk connections), DURATION=8 (s recorded), WARMUP=2,
#   FREQ=999 (samples/s), CALLGRAPH=dwarf (or fp, lbr), SPILLWAY_LOG=warn,
#   PERF_OUT=run/perf.data, ISOLATE=1, MODE=record (perf record; `stat`: task
#   clock, context switches and system calls; `trace`: system calls by kind),
#   TARGET=spillway (or nginx: the NGINX reference's worker, port 18081), BENCH_BODY_FILE
#   (the request sent; lib/request.json), EVENTS (more perf
#   events for `stat`, comma-separated, each reported per request: a uprobe made with
#   `perf probe -x BINARY --add mi_malloc_aligned` counts allocations; for `record`, the
#   events recorded instead of CPU samples, every one of them), BACKEND=up (`down`: the mock
#   backend is not started, so its port refuses every connection and every call is answered
#   503 `capacity_exhausted`: the outage path, which the PGO and BOLT profiles never run).
# Output: wrk's summary on stderr; for `record` the perf data file and
# lib/perf_summary.py's report (self time by group, top symbols) on stdout; for `stat` the
# figures per request, the voluntary context switches (the process waited for work) apart from
# the involuntary ones (the kernel gave its CPU to another process: on two cores shared by
# wrk, the backend and the proxy, throughput at 16 connections follows these).
# Debug line tables come from the release profile.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
cd "$BENCH_DIR"

SPILLWAY_BIN="${SPILLWAY_BIN:-$REPO_DIR/target/release/spillway}"
while [ $# -gt 0 ]; do
  case "$1" in
    --spillway) SPILLWAY_BIN="$(cd "$OLDPWD" && realpath -m -- "${2:?--spillway needs a path}")"; shift 2;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$BENCH_DIR/profile.sh"; exit 0;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
  esac
done
CONNS="${CONNS:-16}"; DURATION="${DURATION:-8}"; WARMUP="${WARMUP:-2}"; FREQ="${FREQ:-999}"
BACKEND="${BACKEND:-up}"
case "$BACKEND" in up|down) ;; *) echo "BACKEND must be up or down" >&2; exit 2;; esac
CALLGRAPH="${CALLGRAPH:-dwarf}"; TARGET="${TARGET:-spillway}"; MODE="${MODE:-record}"; SPILLWAY_LOG="${SPILLWAY_LOG:-warn}"
RUN="$BENCH_DIR/run"; PERF_OUT="${PERF_OUT:-$RUN/perf.data}"
mkdir -p "$RUN/tmp"
for t in nginx wrk perf curl setsid timeout; do
  command -v "$t" >/dev/null 2>&1 || { echo "missing: $t (bench/setup.sh; perf from linux-perf)" >&2; exit 1; }
done
[ -x "$SPILLWAY_BIN" ] || { echo "no spillway binary at $SPILLWAY_BIN" >&2; exit 1; }

if [ -z "${BENCH_INNER:-}" ]; then
  exec 9>"$RUN/lock"
  flock -n 9 || { echo "a benchmark of this checkout is running (bench/run/lock)" >&2; exit 1; }
  export BENCH_INNER=1 BACKEND SPILLWAY_BIN CONNS DURATION WARMUP FREQ CALLGRAPH TARGET MODE SPILLWAY_LOG PERF_OUT
  export EVENTS="${EVENTS:-}"
  if [ "${ISOLATE:-1}" = 1 ] && command -v ip >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
    exec unshare -n -- bash -c 'ip link set lo up && exec "$0"' "$BENCH_DIR/profile.sh"
  fi
  exec "$BENCH_DIR/profile.sh"
fi

BACKEND_PID=""; SPILLWAY_PID=""
# shellcheck source=lib/procs.sh
. "$BENCH_DIR/lib/procs.sh"
trap 'stop_pid "$SPILLWAY_PID"; stop_pid "$BACKEND_PID"' EXIT
for p in 18080 18081 18090 18091; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use" >&2; exit 1; fi
done
[ "$BACKEND" = down ] || start_mock_backend
if [ "$TARGET" = nginx ]; then
  setsid nginx -p "$BENCH_DIR/" -c nginx/proxy.conf -e run/nginx-proxy.error.log \
    -g "daemon off; pid run/nginx-proxy.pid;" >"$RUN/nginx-proxy.out" 2>&1 9>&- &
  SPILLWAY_PID=$!; PORT=18081
  for _ in $(seq 100); do ready http://127.0.0.1:$PORT/health && break; sleep 0.1; done
  # perf follows the worker, the one process that serves requests
  PROFILED="$(pgrep -P "$SPILLWAY_PID" | head -1)"
else
  (cd "$REPO_DIR" && SPILLWAY_LOG="$SPILLWAY_LOG" RUST_LOG="$SPILLWAY_LOG" exec setsid "$SPILLWAY_BIN" serve --config bench/spillway.toml) \
    >"$RUN/spillway.log" 2>&1 9>&- &
  SPILLWAY_PID=$!; PORT=18090; PROFILED=$SPILLWAY_PID
  for _ in $(seq 300); do ready http://127.0.0.1:$PORT/readyz && break; sleep 0.1; done
  ready http://127.0.0.1:$PORT/readyz || { echo "spillway not ready; see bench/run/spillway.log" >&2; exit 1; }
fi

echo "$TARGET pid $PROFILED; wrk -c$CONNS, $WARMUP s warm-up, then $DURATION s measured; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
drive() { # seconds -> wrk's JSON summary line in run/profile-wrk.out
  BENCH_BODY_FILE="${BENCH_BODY_FILE:-$BENCH_DIR/lib/request.json}" timeout $(($1 + 20)) \
    wrk -t1 -c"$CONNS" -d"${1}s" --timeout 10s -s lib/chat.lua \
    http://127.0.0.1:$PORT >"$RUN/profile-wrk.out" 2>&1
}
[ "$WARMUP" = 0 ] || drive "$WARMUP"
# perf is attached just before wrk starts and stays a little longer than wrk runs, so it
# sees every request wrk counts.
case "$MODE" in
  record) if [ -n "$EVENTS" ]; then SAMPLING=(-e "$EVENTS" -c 1); else SAMPLING=(-F "$FREQ"); fi
          perf record "${SAMPLING[@]}" -g --call-graph "$CALLGRAPH" -o "$PERF_OUT" -p "$PROFILED" \
            -- sleep "$((DURATION + 1))" >/dev/null 2>"$RUN/perf.err" &;;
  stat) perf stat -e "task-clock,context-switches,raw_syscalls:sys_enter${EVENTS:+,$EVENTS}" -p "$PROFILED" \
          -- sleep "$((DURATION + 1))" >/dev/null 2>"$RUN/perf.err" &;;
  trace) timeout $((DURATION + 6)) perf trace -s -p "$PROFILED" -o "$RUN/perf-trace.out" \
           -- sleep "$((DURATION + 1))" >/dev/null 2>"$RUN/perf.err" &;;
  *) echo "MODE must be record, stat or trace" >&2; exit 2;;
esac
PERF_PID=$!
sleep 0.3
ticks() { # utime and stime of the profiled process, in clock ticks
  sed 's/^.*) //' "/proc/$PROFILED/stat" | awk '{print $12, $13}'
}
switches() { # its main thread's voluntary and involuntary context switches so far
  awk '/^voluntary_ctxt_switches/ {v = $2} /^nonvoluntary_ctxt_switches/ {n = $2} END {print v, n}' \
    "/proc/$PROFILED/status"
}
TICKS_BEFORE="$(ticks)"; SWITCHES_BEFORE="$(switches)"
drive "$DURATION" || true
TICKS_AFTER="$(ticks)"; SWITCHES_AFTER="$(switches)"
wait "$PERF_PID" || { tail -5 "$RUN/perf.err" >&2; exit 1; }
REQUESTS="$(grep -E '^JSON:' "$RUN/profile-wrk.out" | sed 's/^JSON://' | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')"
grep -E '^JSON:' "$RUN/profile-wrk.out" | sed 's/^JSON://' >&2
if [ "$BACKEND" = down ]; then
  # The outage's figures are those of refusals only: a request answered, or a socket error,
  # would make them figures of something else.
  grep -E '^JSON:' "$RUN/profile-wrk.out" | sed 's/^JSON://' | python3 -c '
import json, sys
run = json.load(sys.stdin)
sockets = sum(v for k, v in run.items() if k.startswith("err_") and k != "err_status")
n, refused = run["requests"], run["err_status"]
if n == 0 or refused != n or sockets:
    sys.exit(f"BACKEND=down: {n} requests, {refused} refused, {sockets} socket errors; every one should be refused")
' || exit 1
fi
echo "requests: $REQUESTS" >&2
case "$MODE" in
  record) python3 "$BENCH_DIR/lib/perf_summary.py" "$PERF_OUT" 40;;
  stat) python3 - "$RUN/perf.err" "$REQUESTS" "$TICKS_BEFORE" "$TICKS_AFTER" "$(getconf CLK_TCK)" "${EVENTS:-}" \
          "$SWITCHES_BEFORE" "$SWITCHES_AFTER" <<'PY'
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
(u0, s0), (u1, s1) = (map(int, sys.argv[i].split()) for i in (3, 4))
hz = int(sys.argv[5])
print(f"{(u1 - u0) * 1e6 / hz / n:8.2f} us user, {(s1 - s0) * 1e6 / hz / n:.2f} us system per request (/proc, whole wrk run)")
(v0, i0), (v1, i1) = (map(int, sys.argv[i].split()) for i in (7, 8))
print(f"{(v1 - v0) / n:8.3f} voluntary, {(i1 - i0) / n:.3f} involuntary context switches per request"
      " (/proc, the main thread, whole wrk run)")
for name, unit in (("task-clock", "us CPU"), ("context-switches", "context switches"),
                   ("raw_syscalls:sys_enter", "system calls")):
    m = re.search(r"([\d.,]+)\s+(?:msec\s+)?" + re.escape(name), text)
    if m:
        v = float(m.group(1).replace(",", ""))
        v = v * 1000 if name == "task-clock" else v
        print(f"{v / n:8.2f} {unit} per request")
for name in filter(None, sys.argv[6].split(",")):
    m = re.search(r"([\d.,]+)\s+" + re.escape(name), text)
    print(f"{float(m.group(1).replace(',', '')) / n:8.2f} {name} per request" if m
          else f"     n/a {name} (not in perf's output)")
PY
  ;;
  trace) grep -vE '^\s*$' "$RUN/perf-trace.out" | head -40;;
esac

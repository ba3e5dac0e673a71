#!/usr/bin/env bash
# Instructions spillway executes per request, counted by valgrind's callgrind: the mock backend
# and spillway with bench/spillway.toml as bench/profile.sh starts them (127.0.0.1 only), spillway
# under callgrind, and one keep-alive client (or CONNS) sending the benchmark's chat request one
# at a time.
# The counters are zeroed after a warm-up and read after N more requests, so the figure is the
# request path's alone. On a quiet machine the same binary gives nearly the same count (within
# about 1 %: work driven by time, such as the metrics exporter's upkeep, falls in it, and grows
# by up to 4 %, and the locked instructions by up to 15 %, while other work, a test run, slows
# the count), so small changes are comparable
# (`A B` below). It counts instructions, not cycles: cache misses and system calls are not in it.
#
# Usage: bench/instructions.sh BINARY [BINARY_B]   (a BINARY of `nginx`: the NGINX reference, one
#   worker process serving in the foreground, counted the same way: the instructions nginx
#   runs for the request spillway is compared with)
# Env (defaults): REQUESTS=2000 (counted), WARMUP=300, TOP=25 (functions listed, by
#   instructions of their own; 0 for none), KEEP= (a directory to keep the callgrind files in),
#   BENCH_HEADERS= (more request headers, "Name: value" separated by '|', as lib/chat.lua
#   takes them; `SDK_HEADERS=1` adds those the official OpenAI Python SDK sends), LOCKED=0 (1: also
#   count the locked read-modify-writes, atomic additions, swaps and compare-and-swaps, a request
#   runs, and where: lib/locked.py; each costs some 20 cycles or more here, one instruction in the
#   count), CACHE=0 (1: also simulate the caches, `--cache-sim=yes`, and count the first-level
#   instruction and data misses a request takes, and where: lib/misses.py, in place of the top
#   functions; a model without prefetching, for comparing builds, and under valgrind SHA-256
#   runs without the CPU's instructions for it), FOOTPRINT=0 (1: also the code a request runs
#   through: the instructions run about once a request or more, their bytes and 64-byte lines,
#   by object and function: lib/footprint.py; at one connection a request fetches those lines
#   again, so their number is its code's cost there more than its instruction count; and the
#   4 KiB pages they lie in; and how many of crates/spillway/hot-symbols.txt's functions, which
#   the release link lays out first, the binary has), HOT_SYMBOLS= (with FOOTPRINT=1: a file to
#   write this binary's hot functions to, hottest first, as hot-symbols.txt lists them),
#   BACKEND=up (`down`: the mock backend is not started, so every call is refused 503
#   `capacity_exhausted`, by NGINX 502: the outage path's instructions a refusal), CONNS=1
#   (keep-alive connections sending at once, each one request at a time: with more than one,
#   the server under callgrind is the slow part and finds several requests ready a wake-up, as
#   under the benchmark's load; the runtime's share a request falls with it).
# Output: per binary, instructions per request, the calls to memcpy and memmove among them (most
#   are moves of values over 128 bytes: lib/copies.py) and the top functions.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
case "${1:-}" in -h|--help|"") sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
REQUESTS="${REQUESTS:-2000}"; WARMUP="${WARMUP:-300}"; TOP="${TOP:-25}"; LOCKED="${LOCKED:-0}"
FOOTPRINT="${FOOTPRINT:-0}"; BACKEND="${BACKEND:-up}"
case "$BACKEND" in up) EXPECT=200;; down) EXPECT=503;; *) echo "BACKEND must be up or down" >&2; exit 2;; esac
DUMP_INSTR=no; { [ "$LOCKED" = 1 ] || [ "$FOOTPRINT" = 1 ]; } && DUMP_INSTR=yes
CACHE_SIM=no; [ "${CACHE:-0}" = 1 ] && CACHE_SIM=yes
BENCH_HEADERS="${BENCH_HEADERS:-}"
if [ "${SDK_HEADERS:-0}" = 1 ]; then
  # As openai 3.56.0 (Python) sends them with a chat completion.
  BENCH_HEADERS="Accept-Encoding: gzip, deflate|x-stainless-lang: python|x-stainless-package-version: 3.56.0|x-stainless-os: Linux|x-stainless-arch: x64|x-stainless-runtime: CPython|x-stainless-runtime-version: 3.11.7|x-stainless-async: false|x-stainless-retry-count: 0|x-stainless-read-timeout: 600${BENCH_HEADERS:+|$BENCH_HEADERS}"
fi
export BENCH_HEADERS
for t in nginx valgrind callgrind_control callgrind_annotate curl python3 setsid; do
  command -v "$t" >/dev/null 2>&1 || { echo "missing: $t (bench/setup.sh; valgrind from Debian's valgrind)" >&2; exit 1; }
done
for bin in "$@"; do [ "$bin" = nginx ] || [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
RUN="$BENCH_DIR/run"; mkdir -p "$RUN"
exec 9>"$RUN/lock"
flock -n 9 || { echo "a benchmark of this checkout is running (bench/run/lock)" >&2; exit 1; }
OUT="${KEEP:-$(mktemp -d)}"; mkdir -p "$OUT"

BACKEND_PID=""; SPILLWAY_PID=""
# shellcheck source=lib/procs.sh
. "$BENCH_DIR/lib/procs.sh"
cleanup() { stop_pid "$SPILLWAY_PID" 10; stop_pid "$BACKEND_PID"; [ -n "${KEEP:-}" ] || rm -rf "$OUT"; }
trap cleanup EXIT
for p in 18080 18081 18090 18091; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use" >&2; exit 1; fi
done
[ "$BACKEND" = down ] || start_mock_backend

n=0
for bin in "$@"; do
  n=$((n + 1)); file="$OUT/callgrind.$n.out"
  if [ "$bin" = nginx ]; then
    # No master process: the one process under callgrind is the worker.
    (cd "$BENCH_DIR" && exec setsid valgrind --tool=callgrind --callgrind-out-file="$file" \
      --dump-instr=$DUMP_INSTR --cache-sim=$CACHE_SIM nginx -p "$BENCH_DIR/" -c nginx/proxy.conf -e run/nginx-proxy.error.log \
      -g "daemon off; master_process off; pid run/nginx-proxy.pid;") >"$RUN/callgrind-nginx.log" 2>&1 9>&- &
    port=18081; probe=/health
  else
    (cd "$REPO_DIR" && SPILLWAY_LOG=warn exec setsid valgrind --tool=callgrind --callgrind-out-file="$file" \
      --dump-instr=$DUMP_INSTR --cache-sim=$CACHE_SIM "$bin" serve --config bench/spillway.toml) >"$RUN/callgrind-spillway.log" 2>&1 9>&- &
    port=18090; probe=/readyz
  fi
  SPILLWAY_PID=$!
  # Under callgrind a server starts some 50 times slower.
  for _ in $(seq 600); do ready "http://127.0.0.1:$port$probe" && break; sleep 0.2; done
  ready "http://127.0.0.1:$port$probe" || { echo "$bin not ready; see bench/run/callgrind-*.log" >&2; exit 1; }
  python3 - "$WARMUP" "$REQUESTS" "$SPILLWAY_PID" "$BENCH_DIR/lib/request.json" "$port" "$([ "$bin" = nginx ] && [ "$BACKEND" = down ] && echo 502 || echo "$EXPECT")" <<'PY'
import http.client, os, subprocess, sys, threading
warmup, requests, pid, body_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
port, expect = int(sys.argv[5]), int(sys.argv[6])
body = open(body_file, "rb").read()
headers = {"Content-Type": "application/json", "Accept": "application/json",
           "Authorization": "Bearer sk-bench-0000", "User-Agent": "bench-instructions/1"}
for item in os.environ.get("BENCH_HEADERS", "").split("|"):
    name, sep, value = item.partition(":")
    if sep and name.strip():
        headers[name.strip()] = value.strip()
conns = int(os.environ.get("CONNS", "1"))
clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=120) for _ in range(conns)]
def client(conn, k, failed):
    for _ in range(k):
        conn.request("POST", "/v1/chat/completions", body, headers)
        r = conn.getresponse(); r.read()
        if r.status != expect:
            failed.append(r.status)
            return
def send(k):
    # CONNS keep-alive connections, each sending its share one request at a time.
    failed = []
    threads = [threading.Thread(target=client, args=(c, k // conns + (i < k % conns), failed))
               for i, c in enumerate(clients)]
    for t in threads: t.start()
    for t in threads: t.join()
    if failed:
        sys.exit(f"answered {failed[0]}, not {expect}")
send(warmup)
subprocess.run(["callgrind_control", "-z", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
send(requests)
subprocess.run(["callgrind_control", "-d", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
PY
  stop_pid "$SPILLWAY_PID" 10; SPILLWAY_PID=""
  # The dump after the zeroing is the second file (`.1`); the first is the one at exit.
  total="$(callgrind_annotate "$file.1" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)"
  [ -n "$total" ] || { echo "no callgrind totals for $bin" >&2; exit 1; }
  echo "$bin: $((total / REQUESTS)) instructions per request ($total over $REQUESTS requests)"
  # Moves of large values and futures among them (lib/copies.py).
  python3 "$BENCH_DIR/lib/copies.py" "$file.1" "$REQUESTS" "$([ "$TOP" = 0 ] && echo 0 || echo 10)"
  if [ "$LOCKED" = 1 ]; then
    python3 "$BENCH_DIR/lib/locked.py" "$file.1" "$REQUESTS" "$TOP"
  fi
  if [ "$FOOTPRINT" = 1 ]; then
    python3 "$BENCH_DIR/lib/footprint.py" "$file.1" "$REQUESTS" "$([ "$TOP" = 0 ] && echo 0 || echo 15)"
    if [ "$bin" != nginx ]; then
      # The functions the link lays out first (crates/spillway/build.rs): those the binary
      # does not have are passed over. A list made from another build of the code (the
      # names of generic code change with it) shows here; HOT_SYMBOLS=FILE writes this
      # binary's own list (lib/hot_symbols.py).
      listed="$REPO_DIR/crates/spillway/hot-symbols.txt"
      found="$(nm --defined-only "$bin" | awk '{print $3}' | sort | comm -12 - <(sort -u "$listed") | wc -l)"
      echo "hot-symbols.txt: $found of $(sort -u "$listed" | wc -l) listed functions are in $bin"
      if [ -n "${HOT_SYMBOLS:-}" ]; then
        python3 "$BENCH_DIR/lib/hot_symbols.py" "$file.1" "$REQUESTS" "$bin" > "$HOT_SYMBOLS"
        echo "this binary's hot functions: $HOT_SYMBOLS ($(wc -l < "$HOT_SYMBOLS") names)"
      fi
    fi
  fi
  if [ "$CACHE_SIM" = yes ]; then
    python3 "$BENCH_DIR/lib/misses.py" "$file.1" "$REQUESTS" "$([ "$TOP" = 0 ] && echo 0 || echo 10)"
  fi
  # callgrind_annotate lists every function at the program's total from a cache-simulating
  # profile; lib/misses.py lists those by function instead.
  if [ "$TOP" != 0 ] && [ "$CACHE_SIM" = no ]; then
    callgrind_annotate --threshold=100 --auto=no "$file.1" 2>/dev/null \
      | grep -E '^ *[0-9,]+ \(' | grep -v -E 'PROGRAM TOTALS|libc-start|below main|spillway::main|__rust_begin_short_backtrace|\?\?\?:main|0x0000' \
      | awk -v n="$TOP" 'NR <= n' | sed -E 's#/root/.cargo/registry/src/[^/]*/##; s#/rustc/[0-9a-f]*/##; s# \[[^]]*\]$##'
  fi
done

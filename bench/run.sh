#!/usr/bin/env bash
# Measure spillway's overhead on loopback against two references, in one run:
#   DIRECT    wrk -> mock backend (nginx + lua, 127.0.0.1:18080)
#   NGINX     wrk -> plain nginx reverse proxy (127.0.0.1:18081) -> backend
#   SPILLWAY  wrk -> spillway serve --config bench/spillway.toml (127.0.0.1:18090) -> backend
# Every repetition measures the three paths back to back at each concurrency, so
# ratios and added latency compare runs from the same minute. See bench/README.md.
#
# Usage: bench/run.sh [--spillway PATH] [--no-build] [--help]
#   --spillway PATH  spillway binary (default: target/release/spillway; built with
#                    `cargo build --release -p spillway` when missing, unless --no-build)
# Env (defaults): DURATION=10 (s per wrk run), REPS=2, CONNS="1 16 64", WARMUP=2,
#   PATHS="direct nginx spillway", SSE=1, SSE_N=50 (sequential streams per path),
#   SSE_CONC=16 and SSE_DURATION=5 (concurrent streams), READY_TIMEOUT=30 (s for
#   spillway's /readyz), SPILLWAY_LOG=warn (spillway's log filter; also given as RUST_LOG),
#   MOCK_SSE_DELAY_MS=2, ISOLATE=1 (run everything in a private network namespace
#   that has only loopback, when `unshare -n` is allowed), OUT=results/latest.md.
# Output: results/latest.md, results/raw/<UTC timestamp>.json; logs in run/.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
cd "$BENCH_DIR"

usage() { sed -n '2,18p' "$BENCH_DIR/run.sh" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- arguments
SPILLWAY_BIN="${SPILLWAY_BIN:-}"
BUILD="${BUILD:-1}"
while [ $# -gt 0 ]; do
  case "$1" in
    --spillway) SPILLWAY_BIN="${2:?--spillway needs a path}"; shift 2;;
    --spillway=*) SPILLWAY_BIN="${1#*=}"; shift;;
    --no-build) BUILD=0; shift;;
    -h|--help) usage; exit 0;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
  esac
done

DURATION="${DURATION:-10}"; REPS="${REPS:-2}"; CONNS="${CONNS:-1 16 64}"; WARMUP="${WARMUP:-2}"
PATHS="${PATHS:-direct nginx spillway}"
SSE="${SSE:-1}"; SSE_N="${SSE_N:-50}"; SSE_CONC="${SSE_CONC:-16}"; SSE_DURATION="${SSE_DURATION:-5}"
READY_TIMEOUT="${READY_TIMEOUT:-30}"; SPILLWAY_LOG="${SPILLWAY_LOG:-warn}"
export MOCK_SSE_DELAY_MS="${MOCK_SSE_DELAY_MS:-2}"
OUT="${OUT:-$BENCH_DIR/results/latest.md}"
RUN="$BENCH_DIR/run"
mkdir -p "$RUN/tmp" "$BENCH_DIR/results/raw"

BACKEND_PORT=18080; NGINX_PORT=18081; SPILLWAY_PORT=18090; SPILLWAY_ADMIN_PORT=18091
BENCH_KEY="sk-bench-0000"

# ------------------------------------------- phase 0: host namespace (tools, build)
if [ -z "${BENCH_INNER:-}" ]; then
  # one run at a time per checkout; fd 9 stays open through the exec below (servers get it closed)
  exec 9>"$RUN/lock"
  if ! flock -n 9; then echo "another bench/run.sh is running (lock bench/run/lock); wait for it to finish" >&2; exit 1; fi
  missing=""
  for t in nginx wrk curl python3 ss timeout setsid flock; do command -v "$t" >/dev/null 2>&1 || missing="$missing $t"; done
  [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || missing="$missing libnginx-mod-http-lua"
  if [ -n "$missing" ]; then echo "missing:$missing — run bench/setup.sh first" >&2; exit 1; fi
  for v in DURATION REPS SSE_N SSE_CONC SSE_DURATION READY_TIMEOUT WARMUP; do
    case "${!v}" in ''|*[!0-9]*) echo "$v must be a whole number (got '${!v}')" >&2; exit 2;; esac
  done
  for c in $CONNS; do case "$c" in ''|*[!0-9]*|0) echo "CONNS must be positive integers" >&2; exit 2;; esac; done

  SPILLWAY_SKIP=""
  if [[ " $PATHS " != *" spillway "* ]]; then
    SPILLWAY_SKIP="not requested (PATHS='$PATHS')"
  else
    if [ -z "$SPILLWAY_BIN" ]; then
      SPILLWAY_BIN="$REPO_DIR/target/release/spillway"
      if [ ! -x "$SPILLWAY_BIN" ] && [ "$BUILD" = 1 ]; then
        if command -v cargo >/dev/null 2>&1; then
          echo "building spillway: cargo build --release -p spillway (log: bench/run/cargo-build.log)" >&2
          if ! (cd "$REPO_DIR" && timeout 3600 cargo build --release -p spillway) >"$RUN/cargo-build.log" 2>&1; then
            echo "cargo build failed; last lines:" >&2; tail -15 "$RUN/cargo-build.log" >&2
          fi
        else
          echo "cargo not found; cannot build spillway" >&2
        fi
      fi
    fi
    case "$SPILLWAY_BIN" in /*) ;; *) SPILLWAY_BIN="$(pwd -P)/$SPILLWAY_BIN";; esac
    if [ ! -x "$SPILLWAY_BIN" ]; then
      SPILLWAY_SKIP="binary not found or not executable: ${SPILLWAY_BIN#"$REPO_DIR"/}"
    fi
  fi
  export SPILLWAY_BIN SPILLWAY_SKIP BENCH_INNER=1
  ISOLATED=0
  if [ "${ISOLATE:-1}" = 1 ] && command -v ip >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
    ISOLATED=1
  elif [ "${ISOLATE:-1}" = 1 ]; then
    echo "note: 'unshare -n' (or ip) is not available here; running in the host network namespace (loopback addresses only)" >&2
  fi
  export ISOLATED
  if [ "$ISOLATED" = 1 ]; then
    exec unshare -n -- bash -c 'ip link set lo up && exec "$0"' "$BENCH_DIR/run.sh"
  fi
  exec "$BENCH_DIR/run.sh"
fi

# ------------------------------------------------- phase 1: measuring (inner)
TS="$(date -u +%Y%m%dT%H%M%SZ)"
JSONL="$RUN/runs.jsonl"; : > "$JSONL"
CHECKS="$RUN/checks.jsonl"; : > "$CHECKS"
RAW="$BENCH_DIR/results/raw/$TS.json"
BACKEND_PID=""; NGINX_PID=""; SPILLWAY_PID=""

log() { echo "$*" >&2; }
jstr() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_pid() { # stop one process we started (and its process group: setsid made it leader), bounded
  local pid="$1" name="$2"
  [ -n "$pid" ] || return 0
  if ! kill -0 "$pid" 2>/dev/null; then   # gone; its group may still hold children
    kill -KILL -- "-$pid" 2>/dev/null || true
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "  $name (pid $pid) ignored SIGTERM for 5 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true   # leftovers of its group (e.g. nginx workers)
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP ERR
  stop_pid "$SPILLWAY_PID" spillway
  stop_pid "$NGINX_PID" nginx-proxy
  stop_pid "$BACKEND_PID" mock-backend
  : > "$RUN/pids"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "run.sh: command failed at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM HUP

wait_http() { # url timeout_s -> 0 when it answers 200
  local url="$1" t="$2" i
  for i in $(seq $((t * 10))); do
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$url" 2>/dev/null)" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}

# leftovers of an earlier run that was killed with SIGKILL (pids recorded in run/pids; we hold
# the lock, so no other run.sh of this checkout is alive and they are orphans)
if [ -s "$RUN/pids" ]; then
  while read -r name pid; do
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qE 'nginx|spillway'; then
      log "stopping $name (pid $pid) left over from an earlier run"; stop_pid "$pid" "$name"
    fi
  done < "$RUN/pids"
fi
: > "$RUN/pids"

for p in $BACKEND_PORT $NGINX_PORT $SPILLWAY_PORT $SPILLWAY_ADMIN_PORT; do
  if port_up "$p"; then log "port $p is already in use on 127.0.0.1; stop whatever listens there first"; exit 1; fi
done

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
DATE_START="$(date -u '+%Y-%m-%d %H:%M:%S')"
log "== bench $TS: DURATION=${DURATION}s REPS=$REPS CONNS='$CONNS' PATHS='$PATHS' isolated_netns=$ISOLATED load=$LOAD_START"

# -- mock backend
setsid nginx -p "$BENCH_DIR/" -c backend/mock-nginx.conf -e run/mock-nginx.error.log \
  -g "daemon off; pid run/mock-nginx.pid;" >"$RUN/mock-nginx.out" 2>&1 9>&- &
BACKEND_PID=$!; echo "mock-backend $BACKEND_PID" >> "$RUN/pids"
if ! wait_http "http://127.0.0.1:$BACKEND_PORT/health" 10; then
  log "mock backend did not start:"; tail -5 "$RUN/mock-nginx.out" "$RUN/mock-nginx.error.log" >&2 2>/dev/null; exit 1
fi
log "mock backend: pid $BACKEND_PID on 127.0.0.1:$BACKEND_PORT"

# -- nginx reverse proxy
if [[ " $PATHS " == *" nginx "* ]]; then
  setsid nginx -p "$BENCH_DIR/" -c nginx/proxy.conf -e run/nginx-proxy.error.log \
    -g "daemon off; pid run/nginx-proxy.pid;" >"$RUN/nginx-proxy.out" 2>&1 9>&- &
  NGINX_PID=$!; echo "nginx-proxy $NGINX_PID" >> "$RUN/pids"
  if ! wait_http "http://127.0.0.1:$NGINX_PORT/health" 10; then
    log "nginx proxy did not start:"; tail -5 "$RUN/nginx-proxy.out" "$RUN/nginx-proxy.error.log" >&2 2>/dev/null; exit 1
  fi
  log "nginx proxy: pid $NGINX_PID on 127.0.0.1:$NGINX_PORT"
fi

# -- spillway
if [ -z "$SPILLWAY_SKIP" ]; then
  log "starting spillway: ${SPILLWAY_BIN#"$REPO_DIR"/} serve --config bench/spillway.toml (SPILLWAY_LOG=$SPILLWAY_LOG)"
  (cd "$REPO_DIR" && SPILLWAY_LOG="$SPILLWAY_LOG" RUST_LOG="$SPILLWAY_LOG" exec setsid "$SPILLWAY_BIN" serve --config bench/spillway.toml) \
    >"$RUN/spillway.log" 2>&1 9>&- &
  SPILLWAY_PID=$!; echo "spillway $SPILLWAY_PID" >> "$RUN/pids"
  ready=0
  for _ in $(seq $((READY_TIMEOUT * 10))); do
    kill -0 "$SPILLWAY_PID" 2>/dev/null || break
    if [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SPILLWAY_PORT/readyz" 2>/dev/null)" = 200 ]; then ready=1; break; fi
    sleep 0.1
  done
  if [ "$ready" != 1 ]; then
    if kill -0 "$SPILLWAY_PID" 2>/dev/null; then
      SPILLWAY_SKIP="GET /readyz on 127.0.0.1:$SPILLWAY_PORT did not answer 200 within ${READY_TIMEOUT}s"
    else
      SPILLWAY_SKIP="spillway exited before it was ready (see bench/run/spillway.log)"
    fi
    log "SPILLWAY skipped: $SPILLWAY_SKIP; log tail:"; tail -10 "$RUN/spillway.log" >&2 || true
    stop_pid "$SPILLWAY_PID" spillway; SPILLWAY_PID=""
  else
    log "spillway: pid $SPILLWAY_PID, /readyz 200 on 127.0.0.1:$SPILLWAY_PORT"
  fi
fi
[ -z "$SPILLWAY_SKIP" ] || log "SPILLWAY path skipped: $SPILLWAY_SKIP"

# targets actually measured, in order
TARGETS=()
for t in $PATHS; do
  case "$t" in
    direct) TARGETS+=(direct);;
    nginx) [ -n "$NGINX_PID" ] && TARGETS+=(nginx);;
    spillway) [ -n "$SPILLWAY_PID" ] && TARGETS+=(spillway);;
    *) log "unknown path '$t' in PATHS (use direct nginx spillway)"; exit 2;;
  esac
done
port_of() { case "$1" in direct) echo $BACKEND_PORT;; nginx) echo $NGINX_PORT;; spillway) echo $SPILLWAY_PORT;; esac; }
pids_of() { case "$1" in direct) echo "";; nginx) echo "$NGINX_PID";; spillway) echo "$SPILLWAY_PID";; esac; }

export BENCH_BODY_FILE="$BENCH_DIR/lib/request.json" BENCH_PATH="/v1/chat/completions" BENCH_AUTH="$BENCH_KEY" BENCH_HEADERS=""
python3 "$BENCH_DIR/lib/streamed.py" "$BENCH_BODY_FILE" > "$RUN/stream-request.json"
AUTH_H=(-H "Content-Type: application/json" -H "Authorization: Bearer $BENCH_KEY")

check() { # name ok(0/1) detail
  echo "{\"path\":\"$1\",\"check\":$(jstr "$2"),\"ok\":$3,\"detail\":$(jstr "$4")}" >> "$CHECKS"
  if [ "$3" = true ]; then log "  check $1: $2 ok ($4)"; else log "  check $1: $2 FAILED ($4)"; fi
}

# -- sanity checks: one completion and one stream through every path
declare -A STREAM_OK
BAD=()
for t in "${TARGETS[@]}"; do
  port=$(port_of "$t")
  code=$(curl -sS -m 10 -o "$RUN/check-$t.json" -w '%{http_code}' "${AUTH_H[@]}" \
         --data-binary @"$BENCH_BODY_FILE" "http://127.0.0.1:$port$BENCH_PATH" 2>/dev/null || true)
  if [ "$code" = 200 ] && grep -q 'capital of France is Paris' "$RUN/check-$t.json"; then
    check "$t" completion true "HTTP $code, mock completion returned"
  else
    check "$t" completion false "HTTP ${code:-none}: $(head -c 200 "$RUN/check-$t.json" 2>/dev/null | tr -d '\n')"
    BAD+=("$t")
  fi
  scode=$(curl -sS -N -m 10 -o "$RUN/check-$t.sse" -w '%{http_code}' "${AUTH_H[@]}" \
          --data-binary @"$RUN/stream-request.json" "http://127.0.0.1:$port$BENCH_PATH" 2>/dev/null || true)
  nev=$(grep -c '^data:' "$RUN/check-$t.sse" 2>/dev/null || true)
  if [ "$scode" = 200 ] && grep -q '^data: \[DONE\]' "$RUN/check-$t.sse"; then
    STREAM_OK[$t]=1; check "$t" stream true "HTTP $scode, $nev data: lines incl. [DONE]"
  else
    STREAM_OK[$t]=0; check "$t" stream false "HTTP ${scode:-none}, $nev data: lines"
  fi
done
rm -f "$RUN/spillway-metrics-before.txt" "$RUN/spillway-metrics-after.txt"
if [ -n "$SPILLWAY_PID" ]; then
  c1=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H "Content-Type: application/json" \
       --data-binary @"$BENCH_BODY_FILE" "http://127.0.0.1:$SPILLWAY_PORT$BENCH_PATH" || true)
  c2=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H "Content-Type: application/json" -H "Authorization: Bearer sk-wrong-key" \
       --data-binary @"$BENCH_BODY_FILE" "http://127.0.0.1:$SPILLWAY_PORT$BENCH_PATH" || true)
  if [ "$c1" = 401 ] && [ "$c2" = 401 ]; then
    check spillway auth true "no key -> $c1, wrong key -> $c2"
  else
    check spillway auth false "no key -> ${c1:-none}, wrong key -> ${c2:-none} (expected 401)"
  fi
  mcode=$(curl -s -m 10 -o "$RUN/spillway-metrics-before.txt" -w '%{http_code}' "http://127.0.0.1:$SPILLWAY_ADMIN_PORT/metrics" || true)
  if [ "$mcode" = 200 ]; then
    check spillway metrics true "GET /metrics on :$SPILLWAY_ADMIN_PORT -> 200, $(grep -c '^[a-zA-Z_]' "$RUN/spillway-metrics-before.txt" || true) samples"
  else
    check spillway metrics false "GET /metrics on :$SPILLWAY_ADMIN_PORT -> ${mcode:-none}"
  fi
fi
# a path that does not return the mock completion is not measured
if [ ${#BAD[@]} -gt 0 ]; then
  keep=()
  for t in "${TARGETS[@]}"; do [[ " ${BAD[*]} " == *" $t "* ]] || keep+=("$t"); done
  TARGETS=("${keep[@]}")
  for t in "${BAD[@]}"; do
    if [ "$t" = direct ]; then log "DIRECT does not work; aborting"; exit 1; fi
    [ "$t" = spillway ] && SPILLWAY_SKIP="sanity check failed: no mock completion through spillway (see checks)"
    log "$t: sanity check failed; not measured"
  done
fi

# -- resource snapshots
pstat() { python3 lib/procstat.py "backend=$BACKEND_PID" "nginx=$NGINX_PID" "spillway=$SPILLWAY_PID"; }
IDLE="$(pstat)"
upstream_sample() { # pids -> JSON: connections to the backend port, mid-run
  local pids="$1" out="$2"
  ss -tanpH "( dport = :$BACKEND_PORT )" 2>/dev/null | python3 -c '
import re, sys, json
pids = set(sys.argv[1].split(",")) - {""}
est = tw = own = 0
for l in sys.stdin:
    f = l.split()
    if not f: continue
    if f[0] == "ESTAB":
        est += 1
        if pids and set(re.findall(r"pid=(\d+)", l)) & pids: own += 1
    elif f[0] == "TIME-WAIT": tw += 1
print(json.dumps({"estab": est, "estab_owned": own if pids else None, "time_wait": tw}))' "$pids" > "$out"
}
tree_pids() { # all pids of the tree rooted at $1, comma-separated (nginx master + workers)
  [ -n "$1" ] || { echo ""; return; }
  echo "$1,$(pgrep -d, -P "$1" || true)" | sed 's/,$//'
}

SPILLWAY_DIED=""
alive() { # target -> 0 when its server processes are still running (aborts when the backend or nginx died)
  kill -0 "$BACKEND_PID" 2>/dev/null || { log "the mock backend (pid $BACKEND_PID) died; see bench/run/mock-nginx.error.log"; exit 1; }
  case "$1" in
    nginx) kill -0 "$NGINX_PID" 2>/dev/null || { log "nginx proxy (pid $NGINX_PID) died; see bench/run/nginx-proxy.error.log"; exit 1; };;
    spillway)
      if ! kill -0 "$SPILLWAY_PID" 2>/dev/null; then
        if [ -z "$SPILLWAY_DIED" ]; then
          SPILLWAY_DIED="spillway (pid $SPILLWAY_PID) exited during the measurements; later SPILLWAY runs are missing (see bench/run/spillway.log)"
          log "!! $SPILLWAY_DIED"; tail -10 "$RUN/spillway.log" >&2 || true
        fi
        return 1
      fi;;
  esac
  return 0
}

wrk_run() { # target conns rep
  local t=$1 c=$2 rep=$3 port before after out up sampler
  alive "$t" || return 0
  port=$(port_of "$t")
  before="$(pstat)"
  ( sleep "$(awk -v d="$DURATION" 'BEGIN{print d/2}')"; upstream_sample "$(tree_pids "$(pids_of "$t")")" "$RUN/upstream.json" ) &
  sampler=$!
  out=$(timeout --foreground -k 5 $((DURATION + 30)) wrk -t1 -c"$c" -d"${DURATION}s" --timeout 10s -s lib/chat.lua \
        "http://127.0.0.1:$port" 2>"$RUN/wrk.err" | grep '^JSON:' | cut -c6- || true)
  wait "$sampler" 2>/dev/null || true
  after="$(pstat)"
  up="$(cat "$RUN/upstream.json" 2>/dev/null || true)"; [ -n "$up" ] || up=null
  if [ -z "$out" ]; then log "  wrk failed for $t c=$c: $(head -c 300 "$RUN/wrk.err")"; out=null; fi
  echo "{\"kind\":\"wrk\",\"target\":\"$t\",\"conns\":$c,\"rep\":$rep,\"res\":$out,\"before\":$before,\"after\":$after,\"upstream\":$up}" >> "$JSONL"
  [ "$out" = null ] || python3 lib/show.py wrk "$t" "$c" "$out" >&2 || true
}

sse_run() { # target mode rep
  local t=$1 mode=$2 rep=$3 port before after out args limit
  alive "$t" || return 0
  port=$(port_of "$t")
  if [ "$mode" = seq ]; then args=(--n "$SSE_N" --concurrency 1); limit=$((SSE_N + 30))
  else args=(--duration "$SSE_DURATION" --concurrency "$SSE_CONC"); limit=$((SSE_DURATION + 60)); fi
  before="$(pstat)"
  out=$(timeout --foreground -k 5 "$limit" python3 lib/sse_bench.py --port "$port" --path "$BENCH_PATH" --body-file "$BENCH_BODY_FILE" \
        --auth "$BENCH_KEY" --timeout 10 "${args[@]}" 2>"$RUN/sse.err" | grep '^JSON:' | cut -c6- || true)
  after="$(pstat)"
  if [ -z "$out" ]; then log "  sse failed for $t $mode: $(head -c 300 "$RUN/sse.err")"; out=null; fi
  echo "{\"kind\":\"sse\",\"target\":\"$t\",\"mode\":\"$mode\",\"rep\":$rep,\"res\":$out,\"before\":$before,\"after\":$after}" >> "$JSONL"
  [ "$out" = null ] || python3 lib/show.py sse "$t" "$mode" "$out" >&2 || true
}

order_for_rep() { # odd reps: as listed; even reps: reversed (cancels drift within a group)
  if [ $(( $1 % 2 )) = 1 ]; then printf '%s\n' "${TARGETS[@]}"; else printf '%s\n' "${TARGETS[@]}" | tac; fi
}

# -- warm-up (not recorded)
if [ "$WARMUP" -gt 0 ]; then
  for t in "${TARGETS[@]}"; do
    timeout --foreground -k 5 $((WARMUP + 30)) wrk -t1 -c16 -d"${WARMUP}s" --timeout 10s -s lib/chat.lua "http://127.0.0.1:$(port_of "$t")" >/dev/null 2>&1 || true
  done
fi

# -- non-streaming runs
for rep in $(seq "$REPS"); do
  for c in $CONNS; do
    log "-- rep $rep/$REPS, $c connection(s)"
    for t in $(order_for_rep "$rep"); do wrk_run "$t" "$c" "$rep"; done
  done
done

# -- streaming runs
if [ "$SSE" = 1 ]; then
  for rep in $(seq "$REPS"); do
    log "-- SSE rep $rep/$REPS (seq: $SSE_N streams on 1 connection; conc: $SSE_CONC streams for ${SSE_DURATION}s)"
    for mode in seq conc; do
      for t in $(order_for_rep "$rep"); do
        if [ "${STREAM_OK[$t]:-0}" = 1 ]; then sse_run "$t" "$mode" "$rep"; fi
      done
    done
  done
fi

FINAL="$(pstat)"
if [ -n "$SPILLWAY_PID" ]; then
  curl -s -m 10 -o "$RUN/spillway-metrics-after.txt" "http://127.0.0.1:$SPILLWAY_ADMIN_PORT/metrics" || true
fi
LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"
DATE_END="$(date -u '+%Y-%m-%d %H:%M:%S')"

# -- versions and machine
ver_nginx="$( (nginx -v 2>&1 || true) | sed 's/^nginx version: //')"
ver_lua="$(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null || echo unknown)"
ver_wrk="$( (wrk -v 2>&1 || true) | head -1 | awk '{print $1" "$2}')"
ver_python="$(python3 -V 2>&1 || true)"
ver_spillway=""
if [ -n "${SPILLWAY_BIN:-}" ] && [ -x "$SPILLWAY_BIN" ]; then
  ver_spillway="$( (timeout 5 "$SPILLWAY_BIN" --version 2>/dev/null || true) | head -1)"
  [ -n "$ver_spillway" ] || ver_spillway="spillway (no --version output)"
  ver_spillway="$ver_spillway; binary built $(date -u -r "$SPILLWAY_BIN" '+%Y-%m-%d %H:%M UTC')"
fi
git_rev="$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git -C "$REPO_DIR" status --porcelain --untracked-files=no 2>/dev/null | head -1)" ]; then git_rev="$git_rev (+ uncommitted changes)"; fi

python3 - "$JSONL" "$CHECKS" "$RAW" <<PY
import json, os, platform, sys
jsonl, checks, out = sys.argv[1:4]
def lines(p): return [json.loads(l) for l in open(p) if l.strip()]
def cpu_model():
    try:
        for l in open("/proc/cpuinfo"):
            if l.startswith("model name"): return l.split(":", 1)[1].strip()
    except OSError: pass
    return platform.machine()
def mem_total_kb():
    for l in open("/proc/meminfo"):
        if l.startswith("MemTotal:"): return int(l.split()[1])
def read(p):
    try: return open(p).read()
    except OSError: return None
meta = {
  "timestamp": "$TS", "date_start_utc": "$DATE_START", "date_end_utc": "$DATE_END",
  "nproc": os.cpu_count(), "cpu_model": cpu_model(), "mem_total_kb": mem_total_kb(),
  "kernel": platform.release(), "loadavg_start": "$LOAD_START", "loadavg_end": "$LOAD_END",
  "isolated_netns": $ISOLATED == 1,
  "duration_s": $DURATION, "reps": $REPS, "conns": [int(c) for c in "$CONNS".split()], "warmup_s": $WARMUP,
  "paths_requested": "$PATHS".split(), "paths_measured": "${TARGETS[*]}".split(),
  "sse": {"enabled": "$SSE" == "1", "seq_n": $SSE_N, "conc": $SSE_CONC, "conc_duration_s": $SSE_DURATION,
          "mock_delay_ms": float("$MOCK_SSE_DELAY_MS")},
  "wrk_cmd": "wrk -t1 -cC -d${DURATION}s --timeout 10s -s lib/chat.lua http://127.0.0.1:PORT",
  "spillway_skipped": $(jstr "$SPILLWAY_SKIP") or None,
  "spillway_died": $(jstr "$SPILLWAY_DIED") or None,
  "spillway_cmd": "SPILLWAY_LOG=$SPILLWAY_LOG spillway serve --config bench/spillway.toml",
  "versions": {"nginx": $(jstr "$ver_nginx"), "libnginx-mod-http-lua": $(jstr "$ver_lua"), "wrk": $(jstr "$ver_wrk"),
               "python": $(jstr "$ver_python"), "spillway": $(jstr "$ver_spillway") or None, "repo_commit": $(jstr "$git_rev")},
  "idle": json.loads('''$IDLE'''), "final": json.loads('''$FINAL'''),
  "checks": lines(checks),
  "spillway_metrics_before": read("$RUN/spillway-metrics-before.txt"),
  "spillway_metrics_after": read("$RUN/spillway-metrics-after.txt"),
}
json.dump({"meta": meta, "runs": lines(jsonl)}, open(out, "w"), indent=1)
PY
python3 lib/summarize.py "$RAW" --out "$OUT"
log "raw: ${RAW#"$BENCH_DIR"/}; table: ${OUT#"$BENCH_DIR"/}"
[ -z "$SPILLWAY_SKIP" ] || log "NOTE: SPILLWAY was not measured: $SPILLWAY_SKIP"
[ -z "$SPILLWAY_DIED" ] || log "NOTE: $SPILLWAY_DIED"

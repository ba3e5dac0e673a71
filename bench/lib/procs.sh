# Shared by bench/profile.sh and bench/instructions.sh (sourced, from bench/): starting the mock
# backend and stopping what a script started, by PID.

# stop_pid PID [SECONDS]: TERM, then after SECONDS (default 5) KILL to its process group (setsid
# made it the leader); a PID that is empty or gone is fine.
stop_pid() {
  local pid="$1" wait_s="${2:-5}"
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((wait_s * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# ready URL: it answers 200 within 5 s.
ready() { [ "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$1" 2>/dev/null)" = 200 ]; }

# start_mock_backend: the mock OpenAI backend on 127.0.0.1:18080 (nginx), its PID in
# BACKEND_PID, waited for up to 10 s.
start_mock_backend() {
  mkdir -p "$BENCH_DIR/run/tmp"
  setsid nginx -p "$BENCH_DIR/" -c backend/mock-nginx.conf -e run/mock-nginx.error.log \
    -g "daemon off; pid run/mock-nginx.pid;" >"$BENCH_DIR/run/mock-nginx.out" 2>&1 9>&- &
  BACKEND_PID=$!
  for _ in $(seq 100); do ready http://127.0.0.1:18080/health && break; sleep 0.1; done
}

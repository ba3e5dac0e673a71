#!/usr/bin/env bash
# Builds spillway and lays its code out again from a profile of the benchmark's load, with BOLT
# (LLVM's post-link optimizer): the blocks a request runs through are put together, each
# function's cold blocks moved out of its way, and the hot functions ordered by how they call
# each other. The code is the same; only where it lies changes.
#
#   1. `cargo build --release -p spillway` with SPILLWAY_LINK_RELOCS=1, which keeps the link's
#      relocations in the binary (crates/spillway/build.rs): BOLT needs them to move functions;
#   2. `llvm-bolt -instrument`: a copy that counts every branch it takes;
#   3. that copy under bench/profile.sh's load (the mock backend, wrk, bench/spillway.toml);
#      it writes its counts when it exits;
#   4. `llvm-bolt` lays the release binary out from the counts, into OUT (its line tables kept);
#   5. OUT answers the benchmark's request: every answer a 2xx, or the script fails.
#
# Usage: bench/bolt.sh
# Env (defaults): OUT=target/release/spillway-bolt, BOLT (llvm-bolt on PATH, else
#   /usr/lib/llvm-16/bin/llvm-bolt, Debian's bolt-16, which bench/setup.sh installs),
#   CONNS=16 and DURATION=6 (the load profiled), plus what bench/profile.sh reads.
# Files: run/bolt/ (the instrumented copy, its counts, llvm-bolt's logs; git-ignored);
#   target/release/spillway is left as the build with relocations (the same code, twice the size).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,20p' "$BENCH_DIR/bolt.sh" | sed 's/^# \{0,1\}//'; exit 0;;
  "") ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
esac

OUT="${OUT:-$REPO_DIR/target/release/spillway-bolt}"
BOLT="${BOLT:-$(command -v llvm-bolt || echo /usr/lib/llvm-16/bin/llvm-bolt)}"
[ -x "$BOLT" ] || { echo "llvm-bolt not found (apt-get install bolt-16, or set BOLT)" >&2; exit 1; }
WORK="$BENCH_DIR/run/bolt"
mkdir -p "$WORK"
RELEASE="$REPO_DIR/target/release/spillway"

echo "bolt: building $RELEASE with its relocations" >&2
(cd "$REPO_DIR" && SPILLWAY_LINK_RELOCS=1 cargo build --release -p spillway)
readelf -S "$RELEASE" | grep -q '\.rela\.text' \
  || { echo "bolt: $RELEASE has no relocations (--emit-relocs did not reach the link)" >&2; exit 1; }
cp "$RELEASE" "$WORK/spillway"

echo "bolt: instrumenting" >&2
rm -f "$WORK/profile.fdata"
"$BOLT" "$WORK/spillway" -instrument -o "$WORK/spillway-instrumented" \
  --instrumentation-file="$WORK/profile.fdata" >"$WORK/instrument.log" 2>&1 \
  || { tail -20 "$WORK/instrument.log" >&2; exit 1; }

echo "bolt: profiling under load (CONNS=${CONNS:-16}, ${DURATION:-6} s)" >&2
CONNS="${CONNS:-16}" DURATION="${DURATION:-6}" MODE=stat \
  "$BENCH_DIR/profile.sh" --spillway "$WORK/spillway-instrumented" >"$WORK/profile.log" 2>&1 \
  || { tail -20 "$WORK/profile.log" >&2; exit 1; }
[ -s "$WORK/profile.fdata" ] || { echo "bolt: the instrumented binary wrote no profile" >&2; exit 1; }

echo "bolt: laying out $OUT" >&2
"$BOLT" "$WORK/spillway" -o "$OUT" -data="$WORK/profile.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=hfsort+ -split-functions -split-all-cold \
  -split-eh -icf=1 -use-gnu-stack -update-debug-sections -dyno-stats >"$WORK/optimize.log" 2>&1 \
  || { tail -20 "$WORK/optimize.log" >&2; exit 1; }
grep -E 'have non-empty execution profile|basic block reordering|splitting separates' \
  "$WORK/optimize.log" | sed 's/^/  /' >&2

echo "bolt: checking that $OUT answers" >&2
CONNS=1 DURATION=2 WARMUP=1 MODE=stat "$BENCH_DIR/profile.sh" --spillway "$OUT" \
  >"$WORK/check.log" 2>&1 || { tail -20 "$WORK/check.log" >&2; exit 1; }
python3 - "$WORK/check.log" <<'PY'
import json, sys
line = next(l for l in open(sys.argv[1]) if l.startswith('{"requests"'))
run = json.loads(line)
errors = sum(v for k, v in run.items() if k.startswith("err_"))
if run["requests"] == 0 or errors:
    sys.exit(f"bolt: the laid-out binary answered {run['requests']} requests with {errors} errors")
print(f"bolt: {run['requests']} requests answered, no errors", file=sys.stderr)
PY
echo "$OUT"

#!/usr/bin/env bash
# Builds spillway and lays its code out again from a profile of the gateway under load, with BOLT
# (LLVM's post-link optimizer): the blocks a request runs through are put together, each
# function's cold blocks moved out of its way, and the hot functions ordered by how they call
# each other. The code is the same; only where it lies changes.
#
#   1. `cargo build --release -p spillway` with SPILLWAY_LINK_RELOCS=1, which keeps the link's
#      relocations in the binary (crates/spillway/build.rs): BOLT needs them to move functions;
#   2. `llvm-bolt -instrument`: a copy that counts every branch it takes;
#   3. that copy under bench/profile.sh's load (the mock backend, wrk, bench/spillway.toml), in
#      three runs: the benchmark's chat request at CONNS connections and at one, and the same
#      request streamed (`"stream": true`, 20 events and `[DONE]`) at 4; each run's counts are
#      written when it exits and the three merged (merge-fdata), so streams are laid out as
#      hot paths too;
#   4. `llvm-bolt` lays the release binary out from the counts, into OUT (its line tables kept);
#   5. OUT answers the benchmark's request: every answer a 2xx, or the script fails.
#
# Usage: bench/bolt.sh
# Env (defaults): OUT=target/release/spillway-bolt, INPUT (a binary built with its relocations to
#   lay out, in place of step 1's build: `RELOCS=1 bench/pgo.sh`'s), BOLT (llvm-bolt on PATH, else
#   /usr/lib/llvm-16/bin/llvm-bolt, Debian's bolt-16, which bench/setup.sh installs), MERGE
#   (merge-fdata on PATH, else the one beside llvm-bolt),
#   CONNS=16 and DURATION=6 (each run profiled), plus what bench/profile.sh reads.
# Files: run/bolt/ (the instrumented copy, its counts, llvm-bolt's logs; git-ignored); without
#   INPUT, target/release/spillway is left as the build with relocations (the same code, twice
#   the size).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$BENCH_DIR/bolt.sh"; exit 0;;
  "") ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
esac

OUT="${OUT:-$REPO_DIR/target/release/spillway-bolt}"
BOLT="${BOLT:-$(command -v llvm-bolt || echo /usr/lib/llvm-16/bin/llvm-bolt)}"
[ -x "$BOLT" ] || { echo "llvm-bolt not found (apt-get install bolt-16, or set BOLT)" >&2; exit 1; }
MERGE="${MERGE:-$(command -v merge-fdata || echo "$(dirname "$(readlink -f "$BOLT")")/merge-fdata")}"
[ -x "$MERGE" ] || { echo "merge-fdata not found beside llvm-bolt (set MERGE)" >&2; exit 1; }
WORK="$BENCH_DIR/run/bolt"
mkdir -p "$(dirname "$OUT")"
mkdir -p "$WORK"
RELEASE="$REPO_DIR/target/release/spillway"

if [ -n "${INPUT:-}" ]; then
  RELEASE="$INPUT"
else
  echo "bolt: building $RELEASE with its relocations" >&2
  (cd "$REPO_DIR" && SPILLWAY_LINK_RELOCS=1 cargo build --release -p spillway)
fi
readelf -S "$RELEASE" | grep -q '\.rela\.text' \
  || { echo "bolt: $RELEASE has no relocations (built without SPILLWAY_LINK_RELOCS=1)" >&2; exit 1; }
cp "$RELEASE" "$WORK/spillway"

echo "bolt: instrumenting" >&2
rm -f "$WORK"/profile.fdata*
"$BOLT" "$WORK/spillway" -instrument -o "$WORK/spillway-instrumented" \
  --instrumentation-file="$WORK/profile.fdata" --instrumentation-file-append-pid \
  >"$WORK/instrument.log" 2>&1 || { tail -20 "$WORK/instrument.log" >&2; exit 1; }

. "$BENCH_DIR/lib/loads.sh"
profile_loads "$WORK/spillway-instrumented" "$WORK"
runs=("$WORK"/profile.fdata.*)
[ "${#runs[@]}" -ge 3 ] || { echo "bolt: ${#runs[@]} profiles written for 3 runs" >&2; exit 1; }
for run in "${runs[@]}"; do
  [ -s "$run" ] || { echo "bolt: $run is empty" >&2; exit 1; }
done
"$MERGE" "${runs[@]}" >"$WORK/profile.fdata" 2>"$WORK/merge.log" \
  || { tail -20 "$WORK/merge.log" >&2; exit 1; }

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
answered "the laid-out binary" "$WORK/check.log"
echo "$OUT"

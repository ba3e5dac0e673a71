#!/usr/bin/env bash
# Builds spillway optimised from a profile of the gateway under load (profile-guided optimisation,
# rustc's `-Cprofile-generate` / `-Cprofile-use`): the compiler inlines, lays out blocks and
# allocates registers for the paths a request takes, from counts of where it went. The code's
# meaning is the same; how it is compiled changes.
#
#   1. an instrumented release build (RUSTFLAGS=-Cprofile-generate), in target/pgo-generate/;
#   2. that build under bench/lib/loads.sh's three loads (the benchmark's chat request at CONNS
#      connections and at one, the same request streamed at 4; each checked to be answered
#      without errors), each run writing its counts when the gateway exits;
#   3. the counts merged with the llvm-profdata of rustc's own LLVM (rustup's llvm-tools
#      component: a profile is read only by the LLVM version that wrote it);
#   4. the release build again with RUSTFLAGS=-Cprofile-use, in target/pgo-use/, copied to OUT;
#   5. OUT answers the benchmark's request: every answer a 2xx, or the script fails.
#
# Usage: bench/pgo.sh
# Env (defaults): OUT=target/release/spillway-pgo, PROFDATA (llvm-profdata in rustc's sysroot,
#   from `rustup component add llvm-tools`), RELOCS=0 (1: the profile-use build keeps its link's
#   relocations, SPILLWAY_LINK_RELOCS=1, so that bench/bolt.sh can lay it out again:
#   `INPUT=target/release/spillway-pgo bench/bolt.sh`), CONNS=16 and DURATION=6 (each run
#   profiled), plus what bench/profile.sh reads.
# Files: run/pgo/ (the counts, the merged profile, the runs' logs; git-ignored). The two builds
#   have target directories of their own, so target/release is left as it was.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$BENCH_DIR/pgo.sh"; exit 0;;
  "") ;;
  *) echo "unknown argument: $1 (see --help)" >&2; exit 2;;
esac

OUT="${OUT:-$REPO_DIR/target/release/spillway-pgo}"
HOST="$(rustc -vV | sed -n 's/^host: //p')"
PROFDATA="${PROFDATA:-$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata}"
[ -x "$PROFDATA" ] || {
  echo "pgo: no llvm-profdata at $PROFDATA (rustup component add llvm-tools, or set PROFDATA)" >&2
  exit 1
}
WORK="$BENCH_DIR/run/pgo"
RAW="$WORK/raw"
mkdir -p "$WORK"
# Both builds name the target so that RUSTFLAGS reach the gateway's crates and not the build
# scripts and procedural macros, which would otherwise be instrumented and write counts of
# their own while the build runs.
build() { # target-dir rustflags [env...]
  local dir="$1" flags="$2"
  shift 2
  (cd "$REPO_DIR" && env "$@" CARGO_TARGET_DIR="$REPO_DIR/$dir" RUSTFLAGS="$flags" \
    cargo build --release -p spillway --target "$HOST")
}

echo "pgo: building an instrumented copy" >&2
rm -rf "$RAW"
build target/pgo-generate "-Cprofile-generate=$RAW"
INSTRUMENTED="$REPO_DIR/target/pgo-generate/$HOST/release/spillway"

. "$BENCH_DIR/lib/loads.sh"
profile_loads "$INSTRUMENTED" "$WORK"
shopt -s nullglob
runs=("$RAW"/*.profraw)
[ "${#runs[@]}" -ge 1 ] || { echo "pgo: the runs wrote no counts into $RAW" >&2; exit 1; }
"$PROFDATA" merge -o "$WORK/merged.profdata" "${runs[@]}"
"$PROFDATA" show "$WORK/merged.profdata" | sed 's/^/  /' >&2

echo "pgo: building from the profile" >&2
relocs=()
[ "${RELOCS:-0}" = 1 ] && relocs=(SPILLWAY_LINK_RELOCS=1)
build target/pgo-use "-Cprofile-use=$WORK/merged.profdata" "${relocs[@]}"
mkdir -p "$(dirname "$OUT")"
cp "$REPO_DIR/target/pgo-use/$HOST/release/spillway" "$OUT"

echo "pgo: checking that $OUT answers" >&2
CONNS=1 DURATION=2 WARMUP=1 MODE=stat "$BENCH_DIR/profile.sh" --spillway "$OUT" \
  >"$WORK/check.log" 2>&1 || { tail -20 "$WORK/check.log" >&2; exit 1; }
answered "the profile-optimised binary" "$WORK/check.log"
echo "$OUT"

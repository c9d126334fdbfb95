#!/usr/bin/env bash
# Counts the user-space instructions one `sluice bench` batch pass executes, per effect, under
# valgrind's callgrind: a measure of the pipeline's own work that does not swing with the
# machine's load, unlike effects/s (this 2-core VM drifts by ±25% from minute to minute).
#
#   scripts/bench-instructions.sh [effects] [-- extra bench flags]
#
# Runs the release build of the checkout (built first if needed) on the embedded pipeline. Kernel
# work (TCP on loopback, fsync) is not counted, and valgrind runs every thread on one core, so
# the pipeline's batching differs from a native run: compare builds with this, and quote
# effects/s from `sluice bench` itself. Repeated runs of one build agree within 0.5%.
# Needs valgrind (Debian: `apt-get install valgrind`); the output file stays in /tmp for
# `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."

effects="${1:-4000}"
shift || true
[ "${1:-}" = "--" ] && shift
if ! command -v valgrind >/dev/null; then
  echo "bench-instructions: valgrind is not installed (apt-get install valgrind)" >&2
  exit 2
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
cargo build --release --locked -p sluice --features distributed >&2
out="$(mktemp -t sluice-callgrind.XXXXXX)"
valgrind --tool=callgrind --callgrind-out-file="$out" \
  "$CARGO_TARGET_DIR/release/sluice" bench --mode batch --no-paced --effects "$effects" "$@" \
  2>"$out.log" | grep -E '^bench batch' || { cat "$out.log" >&2; exit 1; }
total="$(sed -nE 's/.*Collected : ([0-9]+).*/\1/p' "$out.log")"
echo "instructions: $total in all, $((total / effects)) per effect ($effects effects, startup included); profile: $out"

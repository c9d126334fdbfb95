#!/usr/bin/env bash
# The distributed pipeline in a steady state (issue 15, part 4): one paced pass of `sluice bench`
# on deploy/distributed.toml long enough for the due index to fill, with the Cassandra and Kafka
# CPU (scripts/engines/threads-cpu.sh, by thread pool) measured over its last minutes only. A
# closed-loop pass ends before its effects' due entries fall due, so it never sees the sweep's
# share: reading each entry's command, deleting the stale entry, and re-reading what it deleted.
#
#   scripts/bench-steady-ledger.sh [RATE] [MINUTES] [WINDOW]
#       (defaults: 200 effects/s for 10 minutes, the last 3 measured)
#
# SLUICE_BIN=path uses that sluice binary instead of building one (to compare two builds,
# alternately: this VM drifts ±20 %).
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-200}"
minutes="${2:-10}"
window="${3:-3}"
if [ "$window" -ge "$minutes" ]; then
  echo "the window ($window min) must be shorter than the pass ($minutes min)" >&2
  exit 2
fi
effects=$((rate * minutes * 60))
if [ -n "${SLUICE_BIN:-}" ]; then
  sluice="$SLUICE_BIN"
else
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
  cargo build --release --locked -p sluice --features distributed --bin sluice >&2
  sluice="$CARGO_TARGET_DIR/release/sluice"
fi
cpu=scripts/engines/threads-cpu.sh
scripts/engines/start.sh >&2
out="$(mktemp -d -t sluice-steady-ledger.XXXXXX)"
echo "== $effects effects at $rate/s ($(date -u +%H:%M:%S)); CPU over the last $window min"
"$sluice" bench --config deploy/distributed.toml --mode paced --rate "$rate" \
  --effects "$effects" --effects-per-run 1 --partitions 16 >"$out/bench" 2>"$out/log" &
bench=$!
sleep $(((minutes - window) * 60))
$cpu snapshot cassandra >"$out/c0" && $cpu snapshot kafka >"$out/k0"
sleep $((window * 60))
$cpu snapshot cassandra >"$out/c1" && $cpu snapshot kafka >"$out/k1"
if ! wait "$bench"; then
  tail -20 "$out/log" >&2
  exit 1
fi
cat "$out/bench"
measured=$((rate * window * 60))
echo "-- Cassandra CPU by thread pool over the window ($measured effects offered; top 8):"
$cpu diff "$out/c0" "$out/c1" "$measured" | awk 'NR <= 8 || /^total/ { print "   " $0 }'
echo "-- Kafka CPU: $($cpu diff "$out/k0" "$out/k1" "$measured" | tail -1)"
echo "(snapshots and logs in $out)"

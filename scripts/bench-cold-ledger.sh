#!/usr/bin/env bash
# The distributed pipeline on a ledger node just restarted (issue 15: no work amplification when
# the ledger is slow). Starts the single-node engines if they are not running, restarts
# Cassandra, and runs `sluice bench` on deploy/distributed.toml the moment the node answers;
# then passes more on the warming node. Each pass prints its effects/s, latency, ledger round
# trips per effect (LWT and plain, by operation) and the Cassandra and Kafka CPU per effect
# (scripts/engines/threads-cpu.sh, by thread pool).
#
#   scripts/bench-cold-ledger.sh [PASSES] [EFFECTS]      (defaults: 3 passes of 5000 effects)
#
# Warm figures for comparison: set SLUICE_BENCH_WARM=1 to skip the restart.
set -euo pipefail
cd "$(dirname "$0")/.."
passes="${1:-3}"
effects="${2:-5000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
cargo build --release --locked -p sluice --features distributed --bin sluice >&2
sluice="$CARGO_TARGET_DIR/release/sluice"
cpu=scripts/engines/threads-cpu.sh
scripts/engines/start.sh >&2
if [ "${SLUICE_BENCH_WARM:-0}" != 1 ]; then
  scripts/engines/stop.sh cassandra >&2
  scripts/engines/start.sh cassandra >&2
fi
out="$(mktemp -d -t sluice-cold-ledger.XXXXXX)"
for pass in $(seq 1 "$passes"); do
  echo "== pass $pass of $passes ($effects effects, $(date -u +%H:%M:%S))"
  $cpu snapshot cassandra >"$out/c0" && $cpu snapshot kafka >"$out/k0"
  "$sluice" bench --config deploy/distributed.toml --mode batch --no-paced \
    --effects "$effects" --effects-per-run 1 --partitions 16 2>"$out/log" | tee "$out/bench" || {
    tail -20 "$out/log" >&2
    exit 1
  }
  $cpu snapshot cassandra >"$out/c1" && $cpu snapshot kafka >"$out/k1"
  echo "-- Cassandra CPU by thread pool (top 8):"
  $cpu diff "$out/c0" "$out/c1" "$effects" | awk 'NR <= 8 || /^total/ { print "   " $0 }'
  echo "-- Kafka CPU: $($cpu diff "$out/k0" "$out/k1" "$effects" | tail -1)"
done
echo "(snapshots and logs in $out)"

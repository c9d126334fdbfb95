#!/usr/bin/env bash
# How long CONFIRMED effects stop while the dispatchers' consumer group rebalances: the
# distributed pipeline (producer, reconciler, compensator and dispatchers as processes of their
# own, on the Kafka and Cassandra of scripts/engines) under a steady load, where a third
# dispatcher joins and later one is restarted. Prints, per phase, the longest gap between two
# consecutive CONFIRMED events on the events topic (their Kafka timestamps, written by the
# service that confirmed), and how long the effects submitted in the phase took from
# submission to CONFIRMED (p50, p99, slowest): a stop of the whole group shows in the first,
# a stop of some partitions only in the second. Measured, not asserted (docs/scaling.md,
# "Rebalances").
#
#   scripts/bench-rebalance.sh [PROTOCOL] [RATE]
#       PROTOCOL: cooperative (default: cooperative-sticky, static membership from each
#                 dispatcher's name), eager (range,roundrobin without instance ids, a 3 s
#                 heartbeat: what Sluice did before), consumer (KIP-848, static membership)
#       RATE:     effects per second (default 40), IDEMPOTENT email/send, one run each
#
# Timeline: 2 dispatchers; load from t=0; t=30 s a third dispatcher starts; t=60 s dispatcher 1
# is stopped (SIGTERM, a clean shutdown) and started again at once, with the same name (a
# container restarted in its pod, a StatefulSet's pod); t=90 s dispatcher 2 is stopped and a
# dispatcher with a new name started (a Deployment's rolling update); load ends at t=120 s.
# Phases: steady [10,30), join [30,60), restart [60,90), replace [90,120).
#
# SLUICE_BENCH_STATIC=0 leaves the instance ids out (cooperative or consumer without static
# membership); SLUICE_BENCH_HEARTBEAT_MS=n sets the classic protocol's heartbeat.interval.ms
# (the bus's default: 1000; eager runs with librdkafka's 3000, as the builds before). The figures come from scripts/bench-rebalance-report.py, which
# can be run again on a kept directory. SLUICE_BIN_DIR=dir uses the binaries there (sluice, sluice-producer, sluice-dispatcher,
# sluice-reconciler, sluice-compensator, sluice-upstream) instead of building them (debug).
# Ports: 29100-29139 on loopback. Logs and the events read are kept in the directory printed.
set -euo pipefail
cd "$(dirname "$0")/.."
protocol="${1:-cooperative}"
rate="${2:-40}"
static="${SLUICE_BENCH_STATIC:-1}"
heartbeat="${SLUICE_BENCH_HEARTBEAT_MS:-}"
if [ "$protocol" = eager ] && [ -z "$heartbeat" ]; then
  heartbeat=3000 # librdkafka's default, which the builds before cooperative rebalancing kept
fi
case "$protocol" in cooperative | eager | consumer) ;; *)
  echo "PROTOCOL must be cooperative, eager or consumer, not '$protocol'" >&2
  exit 2
  ;;
esac
. scripts/engines/env.sh
brokers="${SLUICE_TEST_KAFKA_BROKERS:-127.0.0.1:${SLUICE_KAFKA_PORT}}"
nodes="${SLUICE_TEST_CQL_NODES:-127.0.0.1:${SLUICE_CQL_PORT}}"

if [ -n "${SLUICE_BIN_DIR:-}" ]; then
  bin="$SLUICE_BIN_DIR"
else
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
  cargo build --bins -p sluice -p sluice-producer -p sluice-dispatcher -p sluice-reconciler \
    -p sluice-compensator -p sluice-upstream --features sluice/distributed >&2
  bin="$CARGO_TARGET_DIR/debug"
fi

out="$(mktemp -d -t sluice-rebalance.XXXXXX)"
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT

secs="$(date +%s)"
unique="$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
prefix="sluice-rb-$unique."
# The Cassandra suites' prefix: their next run drops keyspaces older than ten minutes.
keyspace="sluice_t_${secs}_rb${unique}"
upstream_port=29101
producer_port=29102
cat >"$out/sluice.toml" <<EOF
[ledger]
kind = "cql"
[ledger.cql]
nodes = [$(echo "$nodes" | sed 's/[^,][^,]*/"&"/g')]
keyspace = "$keyspace"
migrate_on_start = false
[bus]
kind = "kafka"
topic_prefix = "$prefix"
partitions = 16
[bus.kafka]
brokers = "$brokers"
replication_factor = 1
[bus.kafka.extra]
"session.timeout.ms" = "10000"
[catalog]
path = "$PWD/deploy/catalog.toml"
[producer]
listen = "127.0.0.1:$producer_port"
open = true
[reconciler]
sweep_interval_ms = 1000
[telemetry]
log_level = "info"
EOF
if [ -n "$heartbeat" ]; then
  sed -i "/session.timeout.ms/a \"heartbeat.interval.ms\" = \"$heartbeat\"" "$out/sluice.toml"
fi
if [ "$protocol" = consumer ]; then
  # KIP-848: the broker owns the session timeout (group.consumer.session.timeout.ms).
  sed -i '/session.timeout.ms/d; /heartbeat.interval.ms/d' "$out/sluice.toml"
fi
export SLUICE_UPSTREAM_URL="http://127.0.0.1:$upstream_port"
export SLUICE_BUS__KAFKA__GROUP_PROTOCOL="$protocol"

"$bin/sluice" migrate --config "$out/sluice.toml" >"$out/migrate.log" 2>&1

# start NAME BINARY METRICS_PORT [INSTANCE_ID]
start() {
  local name="$1" binary="$2" port="$3" instance="${4:-}"
  (
    export SLUICE_TELEMETRY__LISTEN="127.0.0.1:$port"
    if [ -n "$instance" ] && [ "$protocol" != eager ] && [ "$static" = 1 ]; then
      export SLUICE_BUS__KAFKA__INSTANCE_ID="$instance"
    fi
    exec "$bin/$binary" --config "$out/sluice.toml" >>"$out/$name.log" 2>&1
  ) &
  pids+=($!)
  eval "pid_$name=$!"
}
"$bin/sluice-upstream" --listen "127.0.0.1:$upstream_port" --faults none >"$out/upstream.log" 2>&1 &
pids+=($!)
start producer sluice-producer 29110
start reconciler sluice-reconciler 29111
start compensator sluice-compensator 29112
start d1 sluice-dispatcher 29121 "dispatcher-1-$unique"
start d2 sluice-dispatcher 29122 "dispatcher-2-$unique"
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$producer_port/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
sleep 5 # the dispatchers' group settles before the load

now_ms() { date +%s%3N; }
load_start="$(now_ms)"
# Sleeps until SECONDS after the load started (at once if that is past).
sleep_until() {
  local left=$((($1 * 1000 - ($(now_ms) - load_start)) / 1000))
  if [ "$left" -gt 0 ]; then sleep "$left"; fi
}
echo "load_start $load_start" >"$out/marks"
python3 - "$producer_port" "$rate" 120 "$unique" "$out/sent" >"$out/load.log" 2>&1 <<'PY' &
import json, sys, time, urllib.request
port, rate, seconds, unique = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log = open(sys.argv[5], "w")
tick = 0.1
per_tick = max(1, round(rate * tick))
start = time.monotonic()
sent = failed = 0
n = 0
while time.monotonic() - start < seconds:
    due = start + n * tick
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    effects = []
    for _ in range(per_tick):
        i = sent + failed + len(effects)
        effects.append({"run_id": f"r-rb-{unique}-{i}", "decision": 1, "tool": "email/send",
                        "call_idx": 0, "args": {"to": f"user{i}@example.com",
                        "subject": f"rebalance {i}", "body": "a rebalance benchmark effect"}})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/effects/batch",
        data=json.dumps({"effects": effects}).encode(),
        headers={"content-type": "application/json"}, method="POST")
    first = sent + failed
    at = time.time_ns() // 1_000_000
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
        sent += len(effects)
        print(first, len(effects), at, file=log, flush=True)
    except Exception as error:  # noqa: BLE001 - counted and reported
        failed += len(effects)
        print("submission failed:", error, flush=True)
    n += 1
print(f"sent {sent} failed {failed}", flush=True)
PY
load=$!
pids+=($load)
sleep_until 30
echo "join $(now_ms)" >>"$out/marks"
start d3 sluice-dispatcher 29123 "dispatcher-3-$unique"
sleep_until 60
echo "restart $(now_ms)" >>"$out/marks"
# shellcheck disable=SC2154 # set by start
kill -TERM "$pid_d1"
wait "$pid_d1" 2>/dev/null || true
start d1 sluice-dispatcher 29121 "dispatcher-1-$unique"
echo "restarted $(now_ms)" >>"$out/marks"
sleep_until 90
echo "replace $(now_ms)" >>"$out/marks"
# shellcheck disable=SC2154 # set by start
kill -TERM "$pid_d2"
wait "$pid_d2" 2>/dev/null || true
start d4 sluice-dispatcher 29124 "dispatcher-4-$unique"
echo "replaced $(now_ms)" >>"$out/marks"
wait "$load"
echo "load_end $(now_ms)" >>"$out/marks"
sleep 15 # what is queued drains

scripts/engines/kafka-tool.sh console-consumer --bootstrap-server "$brokers" \
  --topic "${prefix}events" --from-beginning --timeout-ms 20000 \
  --property print.timestamp=true --property print.headers=true --property print.value=false \
  >"$out/events" 2>"$out/events.log" || true

membership="dynamic membership"
if [ "$protocol" != eager ] && [ "$static" = 1 ]; then
  membership="static membership"
fi
python3 scripts/bench-rebalance-report.py "$out" \
  "group protocol $protocol ($membership${heartbeat:+, heartbeat.interval.ms $heartbeat}), $rate effects/s"
# The run's topics go; its keyspace is dropped by the next Cassandra suite run (its prefix).
scripts/engines/kafka-tool.sh topics --bootstrap-server "$brokers" --delete \
  --topic "${prefix//./\\.}.*" >/dev/null 2>&1 || echo "could not delete the topics ${prefix}*" >&2
echo "(logs, marks and events in $out)"

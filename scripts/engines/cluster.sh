#!/usr/bin/env bash
# cluster.sh COMMAND [NODE] — runs 3-node test clusters on loopback, for the
# cluster test (tests/tests/cluster.rs), apart from start.sh's single nodes:
#   Cassandra 5.0.9: nodes cassandra-1..3 on 127.0.0.1, .2, .3, CQL 24042 and
#     storage 24700 on each address, JMX 24199/24200/24201, heap 640m each.
#   Kafka 4.1.1, KRaft combined broker+controller: nodes kafka-1..3 on
#     127.0.0.1:24092/24192/24292 (controllers 24093/24193/24293), heap 384m,
#     default.replication.factor=3, min.insync.replicas=2.
# Commands:
#   start          fresh clusters (their runtime dirs wiped), all six JVMs at
#                  once; ready = every node answers and the clusters formed
#                  (nodetool status shows 3 UN, Kafka metadata 3 brokers).
#                  Prints "export SLUICE_TEST_CLUSTER_...=..." lines on stdout.
#   stop [NODE]    SIGTERM, wait, then SIGKILL: every node, or one.
#   kill NODE      SIGKILL one node (kill -9), and wait until it is gone.
#   restart NODE   stop NODE if it runs, start it again on its data, and wait
#                  until it is back in its cluster.
#   status         each node's pid and RSS; nodetool status; Kafka brokers.
#   env            the export lines only.
# Only ever signals processes whose command line carries this cache's cluster
# config paths ($SLUICE_CLUSTER_RUN/<node>/conf/...): never start.sh's engines.
# Ports, heaps and paths come from env.sh. Timeouts: SLUICE_CLUSTER_START_TIMEOUT
# (default 300 s for the whole start, or for one node's restart).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

TIMEOUT="${SLUICE_CLUSTER_START_TIMEOUT:-300}"
NODES=(cassandra-1 cassandra-2 cassandra-3 kafka-1 kafka-2 kafka-3)
# One token per node, evenly spread over the Murmur3 range: no vnodes to
# allocate and no bootstrap, so the three can start at the same time.
TOKENS=(-9223372036854775808 -3074457345618258603 3074457345618258602)

node_kind() { printf '%s\n' "${1%-*}"; }
node_index() { printf '%s\n' "${1##*-}"; }
node_run() { printf '%s\n' "$SLUICE_CLUSTER_RUN/$1"; }
# Beside (not inside) the node's run dir, so a wipe never loses a live pid.
node_pidfile() { printf '%s\n' "$SLUICE_CLUSTER_RUN/$1.pid"; }
node_marker() {
  case "$(node_kind "$1")" in
    cassandra) printf '%s\n' "$(node_run "$1")/conf/cassandra.yaml" ;;
    kafka) printf '%s\n' "$(node_run "$1")/conf/server.properties" ;;
  esac
}
node_log() {
  case "$(node_kind "$1")" in
    cassandra) printf '%s\n' "$(node_run "$1")/logs/system.log" ;;
    kafka) printf '%s\n' "$(node_run "$1")/logs/server.log" ;;
  esac
}
cassandra_host() { printf '127.0.0.%s\n' "$(node_index "$1")"; }
cassandra_jmx() { printf '%s\n' "$((SLUICE_CLUSTER_JMX_PORT + $(node_index "$1") - 1))"; }
kafka_port() { printf '%s\n' "$((SLUICE_CLUSTER_KAFKA_PORT + 100 * ($(node_index "$1") - 1)))"; }
kafka_controller_port() {
  printf '%s\n' "$((SLUICE_CLUSTER_KAFKA_CONTROLLER_PORT + 100 * ($(node_index "$1") - 1)))"
}

check_node() {
  local n
  for n in "${NODES[@]}"; do [[ "$1" == "$n" ]] && return 0; done
  die "unknown node '$1' (expected one of ${NODES[*]})"
}

# node_pid NODE — the pid of our running instance of NODE, or return 1.
node_pid() {
  pid_by_marker "$(node_pidfile "$1")" "$(node_marker "$1")"
}

# wait_gone NODE PID TICKS — waits up to TICKS half-seconds for PID to exit.
wait_gone() {
  local node="$1" pid="$2" ticks="$3" waited=0
  while pid_matches "$pid" "$(node_marker "$node")" && ((waited < ticks)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  ! pid_matches "$pid" "$(node_marker "$node")"
}

# signal_node NODE TERM|KILL — signals our instance of NODE (if any) and waits
# until it is gone; TERM falls back to KILL after the grace (Cassandra 60 s,
# Kafka 30 s, as stop.sh).
signal_node() {
  local node="$1" how="$2" pid grace waited=0
  if ! pid="$(node_pid "$node")"; then
    say "$node: not running"
    rm -f "$(node_pidfile "$node")"
    return 0
  fi
  case "$(node_kind "$node")" in
    cassandra) grace="${SLUICE_CASSANDRA_STOP_GRACE:-60}" ;;
    kafka) grace="${SLUICE_KAFKA_STOP_GRACE:-30}" ;;
  esac
  say "$node: SIG$how pid $pid"
  kill "-$how" "$pid" 2>/dev/null || true
  if ! wait_gone "$node" "$pid" $((grace * 2)); then
    say "$node: still alive after ${grace} s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$node" "$pid" 20 || die "$node: pid $pid survived SIGKILL"
  fi
  # Reaped or a zombie: its sockets are closed and its ports free.
  while ! proc_exited "$pid" && ((waited < 20)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  rm -f "$(node_pidfile "$node")"
}

# ------------------------------------------------------------ Cassandra ------

cassandra_write_config() {
  local node="$1" run host i
  run="$(node_run "$node")"
  host="$(cassandra_host "$node")"
  i="$(node_index "$node")"
  cat >"$run/conf/cassandra.yaml" <<EOF
# Generated by scripts/engines/cluster.sh — node $i of a 3-node test cluster.
cluster_name: sluice-cluster
num_tokens: 1
initial_token: ${TOKENS[$((i - 1))]}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:${SLUICE_CLUSTER_STORAGE_PORT},127.0.0.2:${SLUICE_CLUSTER_STORAGE_PORT},127.0.0.3:${SLUICE_CLUSTER_STORAGE_PORT}"
listen_address: ${host}
rpc_address: ${host}
storage_port: ${SLUICE_CLUSTER_STORAGE_PORT}
native_transport_port: ${SLUICE_CLUSTER_CQL_PORT}
$(cassandra_common_yaml "$run")
# Two cores for six JVMs and the services: few background threads.
concurrent_compactors: 1
memtable_flush_writers: 1
# A killed node is noticed in a few seconds rather than ~10.
phi_convict_threshold: 6
EOF
  cassandra_write_logging "$run" cluster.sh
}

cassandra_launch() {
  local node="$1" run
  run="$(node_run "$node")"
  mkdir -p "$run/tmp"
  cassandra_jvm_opts "$run" "$(cassandra_jmx "$node")" \
    "$SLUICE_CLUSTER_CASSANDRA_HEAP" "$SLUICE_CLUSTER_CASSANDRA_HEAP_MIN"
  local -a opts=(
    "${CASSANDRA_OPTS[@]}"
    # Seeds with fixed tokens and no bootstrap: nothing to wait for in gossip.
    -Dcassandra.skip_wait_for_gossip_to_settle=0
    -Dcassandra.ring_delay_ms=1000
  )
  # shellcheck disable=SC2206 # extra options are word-split on purpose
  opts+=(${SLUICE_CASSANDRA_JVM_OPTS:-})
  nohup java "${opts[@]}" -cp "$SLUICE_CASSANDRA_LIB/*" org.apache.cassandra.service.CassandraDaemon \
    </dev/null >>"$run/logs/stdout.log" 2>&1 &
  echo $! >"$(node_pidfile "$node")"
  say "$node: started pid $! on $(cassandra_host "$node"):$SLUICE_CLUSTER_CQL_PORT"
}

# nodetool ARG... — Cassandra's nodetool against node 1's JMX (or $NODETOOL_PORT),
# bounded to 60 s.
nodetool() {
  # The JPMS flags the tool's FileUtils needs on Java 17.
  timeout 60 java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/java.nio=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
    -Dlogback.configurationFile="$ENGINES_DIR/conf/tools-logback.xml" \
    -cp "$SLUICE_CASSANDRA_LIB/*" org.apache.cassandra.tools.NodeTool \
    -h 127.0.0.1 -p "${NODETOOL_PORT:-$SLUICE_CLUSTER_JMX_PORT}" "$@"
}

# cassandra_answers NODE — its log says started and a CQL query answers on it.
cassandra_answers() {
  local node="$1"
  grep -q 'Startup complete' "$(node_log "$node")" 2>/dev/null &&
    port_open "$SLUICE_CLUSTER_CQL_PORT" "$(cassandra_host "$node")" &&
    SLUICE_CQL_HOST="$(cassandra_host "$node")" SLUICE_CQL_PORT="$SLUICE_CLUSTER_CQL_PORT" \
      SLUICE_CQL_QUERY_TIMEOUT=10 "$HERE/cql-query.sh" "SELECT release_version FROM system.local" \
      >/dev/null 2>&1
}

# cassandra_ring_up NODE — NODE's own view of the ring: 3 nodes Up and Normal.
cassandra_ring_up() {
  local out
  out="$(NODETOOL_PORT="$(cassandra_jmx "$1")" nodetool status 2>/dev/null)" || return 1
  [[ "$(grep -cE '^UN ' <<<"$out")" -eq 3 ]]
}

# ---------------------------------------------------------------- Kafka ------

kafka_voters() {
  local i out=""
  for i in 1 2 3; do
    out+="${out:+,}$i@127.0.0.1:$((SLUICE_CLUSTER_KAFKA_CONTROLLER_PORT + 100 * (i - 1)))"
  done
  printf '%s\n' "$out"
}

kafka_write_config() {
  local node="$1" run i
  run="$(node_run "$node")"
  i="$(node_index "$node")"
  cat >"$run/conf/server.properties" <<EOF
# Generated by scripts/engines/cluster.sh — node $i of a 3-node KRaft cluster
# (each node a broker and a controller).
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$(kafka_voters)
listeners=PLAINTEXT://127.0.0.1:$(kafka_port "$node"),CONTROLLER://127.0.0.1:$(kafka_controller_port "$node")
advertised.listeners=PLAINTEXT://127.0.0.1:$(kafka_port "$node")
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=${run}/data
num.partitions=1
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
auto.create.topics.enable=false
# Three replicas of everything; a write is acknowledged (acks=all) once two
# have it, so one broker may be down without refusing publishes.
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# A killed broker is fenced (its partitions led elsewhere) after 6 s, not 9.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
EOF
  kafka_write_logging "$run" cluster.sh
}

kafka_format() {
  local node="$1" id="$2" run
  run="$(node_run "$node")"
  timeout 120 "$HERE/kafka-tool.sh" storage format -t "$id" \
    -c "$run/conf/server.properties" >"$run/logs/format.log" 2>&1 ||
    die "$node: storage format failed: $(tail -n 5 "$run/logs/format.log")"
}

kafka_launch() {
  local node="$1" run
  run="$(node_run "$node")"
  # shellcheck disable=SC2086 # extra options are word-split on purpose
  nohup java -Xms"$SLUICE_CLUSTER_KAFKA_HEAP_MIN" -Xmx"$SLUICE_CLUSTER_KAFKA_HEAP" ${SLUICE_KAFKA_JVM_OPTS:-} \
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true \
    -Dkafka.logs.dir="$run/logs" \
    -Dlog4j2.configurationFile="$run/conf/log4j2.xml" \
    -cp "$SLUICE_KAFKA_LIB/*" kafka.Kafka "$run/conf/server.properties" \
    </dev/null >>"$run/logs/stdout.log" 2>&1 &
  echo $! >"$(node_pidfile "$node")"
  say "$node: started pid $! on 127.0.0.1:$(kafka_port "$node")"
}

# kafka_brokers_seen NODE — how many brokers NODE's metadata names (each one
# answered an ApiVersions request).
kafka_brokers_seen() {
  local out
  out="$(timeout 60 "$HERE/kafka-tool.sh" org.apache.kafka.tools.BrokerApiVersionsCommand \
    --bootstrap-server "127.0.0.1:$(kafka_port "$1")" \
    --command-config "$(node_run "$1")/conf/probe-client.properties" 2>/dev/null)" || {
    echo 0
    return 0
  }
  grep -cE '^127\.0\.0\.1:[0-9]+ \(id: [0-9]+ ' <<<"$out" || true
}

# ------------------------------------------------------------------ main -----

# wait_ready NODE... — until each node answers (CQL on its address, Kafka on its
# port) and the clusters formed, seen from the first listed node of each kind
# (nodetool status there shows 3 UN; its Kafka metadata names 3 brokers that
# answer), or the timeout; on failure prints the logs' tails and exits 1 (nodes
# left up for inspection; stop them with `cluster.sh stop`).
wait_ready() {
  local start=$SECONDS node pid via
  local -A up=() formed=()
  while :; do
    local pending=0
    for node in "$@"; do
      pid="$(node_pid "$node")" || fail_node "$node" "process exited during startup"
      if [[ -z "${up[$node]:-}" ]]; then
        case "$(node_kind "$node")" in
          cassandra) cassandra_answers "$node" && up[$node]=1 ;;
          kafka) port_open "$(kafka_port "$node")" && up[$node]=1 ;;
        esac
        [[ -n "${up[$node]:-}" ]] &&
          say "$node: answers after $((SECONDS - start)) s, pid $pid, RSS $(rss_mib "$pid") MiB"
      fi
      [[ -n "${up[$node]:-}" ]] || pending=$((pending + 1))
    done
    if ((pending == 0)); then
      for node in "$@"; do
        via="${formed[$(node_kind "$node")]:-}"
        [[ -z "$via" ]] || continue
        case "$(node_kind "$node")" in
          cassandra) cassandra_ring_up "$node" && formed[cassandra]="$node" ;;
          kafka) [[ "$(kafka_brokers_seen "$node")" -eq 3 ]] && formed[kafka]="$node" ;;
        esac
        if [[ -n "${formed[$(node_kind "$node")]:-}" ]]; then
          say "$(node_kind "$node"): 3 nodes in the cluster as $node sees it, after $((SECONDS - start)) s"
        else
          pending=$((pending + 1))
        fi
      done
      ((pending == 0)) && return 0
    fi
    ((SECONDS - start < TIMEOUT)) || {
      for node in "$@"; do
        [[ -n "${up[$node]:-}" ]] || fail_node "$node" "not answering after ${TIMEOUT} s"
      done
      fail_node "$1" "the cluster did not form in ${TIMEOUT} s (as $1 sees it)"
    }
    sleep 2
  done
}

fail_node() {
  local node="$1" msg="$2" f
  printf '[engines] ERROR: %s: %s\n' "$node" "$msg" >&2
  for f in "$(node_log "$node")" "$(node_run "$node")/logs/stdout.log"; do
    if [[ -s "$f" ]]; then
      printf '[engines] ---- last 30 lines of %s ----\n' "$f" >&2
      tail -n 30 "$f" >&2
    fi
  done
  die "$node did not become ready (logs in $(node_run "$node")/logs; stop with $0 stop)"
}

print_env() {
  echo "export SLUICE_TEST_CLUSTER_CQL_NODES=$SLUICE_TEST_CLUSTER_CQL_NODES # cassandra $SLUICE_CASSANDRA_VERSION x3"
  echo "export SLUICE_TEST_CLUSTER_KAFKA_BROKERS=$SLUICE_TEST_CLUSTER_KAFKA_BROKERS # kafka $SLUICE_KAFKA_VERSION x3"
}

cmd_start() {
  local node p id started=$SECONDS running=()
  for node in "${NODES[@]}"; do
    if node_pid "$node" >/dev/null; then running+=("$node"); fi
  done
  if ((${#running[@]} == ${#NODES[@]})); then
    say "cluster: already running, checking it answers"
    wait_ready "${NODES[@]}"
    print_env
    return 0
  fi
  ((${#running[@]} == 0)) || die "partly running (${running[*]}): run '$0 stop' first, or restart the missing nodes"
  for p in "$SLUICE_CLUSTER_CQL_PORT:127.0.0.1" "$SLUICE_CLUSTER_CQL_PORT:127.0.0.2" \
    "$SLUICE_CLUSTER_CQL_PORT:127.0.0.3" "$SLUICE_CLUSTER_STORAGE_PORT:127.0.0.1" \
    "$SLUICE_CLUSTER_STORAGE_PORT:127.0.0.2" "$SLUICE_CLUSTER_STORAGE_PORT:127.0.0.3" \
    "$SLUICE_CLUSTER_JMX_PORT:127.0.0.1" "$((SLUICE_CLUSTER_JMX_PORT + 1)):127.0.0.1" \
    "$((SLUICE_CLUSTER_JMX_PORT + 2)):127.0.0.1" "$(kafka_port kafka-1):127.0.0.1" \
    "$(kafka_port kafka-2):127.0.0.1" "$(kafka_port kafka-3):127.0.0.1" \
    "$(kafka_controller_port kafka-1):127.0.0.1" "$(kafka_controller_port kafka-2):127.0.0.1" \
    "$(kafka_controller_port kafka-3):127.0.0.1"; do
    if port_open "${p%%:*}" "${p#*:}"; then
      die "port ${p#*:}:${p%%:*} is already in use by another process"
    fi
  done
  "$HERE/install.sh" all
  id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' | sed 's/^-/A/')"
  for node in "${NODES[@]}"; do
    safe_wipe "$(node_run "$node")"
    mkdir -p "$(node_run "$node")/conf" "$(node_run "$node")/data" "$(node_run "$node")/logs"
    "$(node_kind "$node")_write_config" "$node"
  done
  # Cassandra first: it takes longest to boot; the three Kafka formats (short
  # JVMs) run while it does.
  for node in cassandra-1 cassandra-2 cassandra-3; do cassandra_launch "$node"; done
  local -a formats=()
  for node in kafka-1 kafka-2 kafka-3; do
    kafka_format "$node" "$id" &
    formats+=($!)
  done
  wait "${formats[@]}" || true
  for node in kafka-1 kafka-2 kafka-3; do
    [[ -f "$(node_run "$node")/data/meta.properties" ]] ||
      die "$node: storage format failed: $(tail -n 5 "$(node_run "$node")/logs/format.log")"
    kafka_launch "$node"
  done
  wait_ready "${NODES[@]}"
  say "cluster: ready in $((SECONDS - started)) s (6 nodes, RSS $(total_rss) MiB)"
  print_env
}

total_rss() {
  local node pid sum=0
  for node in "${NODES[@]}"; do
    if pid="$(node_pid "$node")"; then sum=$((sum + $(rss_mib "$pid"))); fi
  done
  printf '%s\n' "$sum"
}

cmd_stop() {
  local node
  if [[ $# -eq 1 ]]; then
    signal_node "$1" TERM
    return 0
  fi
  # All at once: each waits for its own process.
  for node in "${NODES[@]}"; do signal_node "$node" TERM & done
  wait
  say "cluster: stopped"
}

cmd_restart() {
  local node="$1" run started=$SECONDS
  run="$(node_run "$node")"
  [[ -f "$(node_marker "$node")" ]] || die "$node was never started here: run '$0 start'"
  signal_node "$node" TERM
  # A fresh log, so the ready check reads this start's lines only.
  [[ -f "$(node_log "$node")" ]] && mv -f "$(node_log "$node")" "$(node_log "$node").$(date +%s)"
  "$(node_kind "$node")_launch" "$node"
  wait_ready "$node"
  say "$node: back in its cluster after $((SECONDS - started)) s"
}

cmd_status() {
  local node pid
  for node in "${NODES[@]}"; do
    if pid="$(node_pid "$node")"; then
      say "$node: pid $pid, RSS $(rss_mib "$pid") MiB"
    else
      say "$node: down"
    fi
  done
  local n
  for n in cassandra-1 cassandra-2 cassandra-3; do
    if node_pid "$n" >/dev/null; then
      NODETOOL_PORT="$(cassandra_jmx "$n")" nodetool status || true
      break
    fi
  done
  for n in kafka-1 kafka-2 kafka-3; do
    if node_pid "$n" >/dev/null; then
      say "kafka brokers seen from $n: $(kafka_brokers_seen "$n")"
      break
    fi
  done
}

[[ $# -ge 1 ]] || { usage; exit 2; }
command -v java >/dev/null || die "java not found (Java 17 is needed)"
mkdir -p "$SLUICE_CLUSTER_RUN"
case "$1" in
  start) cmd_start ;;
  stop)
    [[ $# -le 2 ]] || die "stop takes at most one node"
    if [[ $# -eq 2 ]]; then check_node "$2"; fi
    cmd_stop "${@:2}"
    ;;
  kill)
    [[ $# -eq 2 ]] || die "kill takes one node"
    check_node "$2"
    signal_node "$2" KILL
    ;;
  restart)
    [[ $# -eq 2 ]] || die "restart takes one node"
    check_node "$2"
    cmd_restart "$2"
    ;;
  status) cmd_status ;;
  env) print_env ;;
  -h | --help) usage ;;
  *) die "unknown command '$1' (see --help)" ;;
esac

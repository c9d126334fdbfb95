# shellcheck shell=bash
# lib.sh — helpers shared by install.sh, start.sh, stop.sh and kafka-tool.sh.
# Not meant to be run; sourced after env.sh. Defines functions only.

ENGINES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ENGINES_DIR

say() { printf '[engines] %s\n' "$*" >&2; }
die() { printf '[engines] ERROR: %s\n' "$*" >&2; exit 1; }

# parse_engines ARG... — sets the global array ENGINES from
# kafka|cassandra|cassandra-tls|all (default all; all includes cassandra-tls
# unless SLUICE_ENGINES_TLS=0).
parse_engines() {
  ENGINES=()
  local a
  if [[ $# -eq 0 ]]; then set -- all; fi
  for a in "$@"; do
    case "$a" in
      kafka | cassandra | cassandra-tls) ENGINES+=("$a") ;;
      all)
        ENGINES+=(kafka cassandra)
        if [[ "${SLUICE_ENGINES_TLS:-1}" == 1 ]]; then ENGINES+=(cassandra-tls); fi
        ;;
      -h | --help) return 2 ;;
      *) die "unknown engine '$a' (expected kafka, cassandra, cassandra-tls or all)" ;;
    esac
  done
}

engine_run_dir() {
  case "$1" in
    kafka) printf '%s\n' "$SLUICE_KAFKA_RUN" ;;
    cassandra) printf '%s\n' "$SLUICE_CASSANDRA_RUN" ;;
    cassandra-tls) printf '%s\n' "$SLUICE_CASSANDRA_TLS_RUN" ;;
  esac
}

engine_lib_dir() {
  case "$1" in
    kafka) printf '%s\n' "$SLUICE_KAFKA_LIB" ;;
    cassandra | cassandra-tls) printf '%s\n' "$SLUICE_CASSANDRA_LIB" ;;
  esac
}

engine_log() {
  case "$1" in
    kafka) printf '%s\n' "$SLUICE_KAFKA_RUN/logs/server.log" ;;
    cassandra) printf '%s\n' "$SLUICE_CASSANDRA_RUN/logs/system.log" ;;
    cassandra-tls) printf '%s\n' "$SLUICE_CASSANDRA_TLS_RUN/logs/system.log" ;;
  esac
}

engine_stdout_log() { printf '%s\n' "$(engine_run_dir "$1")/logs/stdout.log"; }

# The pid file sits beside (not inside) the run dir, so wiping the run dir can
# never lose the pid of a live process.
engine_pidfile() { printf '%s\n' "$SLUICE_ENGINES_RUN/$1.pid"; }

# A string that appears only in the command line of *our* instance of the
# engine (the absolute path of its config file), used to recognise it.
engine_marker() {
  case "$1" in
    kafka) printf '%s\n' "$SLUICE_KAFKA_RUN/conf/server.properties" ;;
    cassandra) printf '%s\n' "$SLUICE_CASSANDRA_RUN/conf/cassandra.yaml" ;;
    cassandra-tls) printf '%s\n' "$SLUICE_CASSANDRA_TLS_RUN/conf/cassandra.yaml" ;;
  esac
}

# pid_matches PID MARKER — true if PID is alive and its command line has MARKER.
pid_matches() {
  local pid="$1" marker="$2" cmd
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"$marker"* ]]
}

# proc_exited PID — true if PID is gone or a zombie (files and sockets closed).
proc_exited() {
  local state
  state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)"
  [[ -z "$state" || "$state" == Z ]]
}

# engine_pid ENGINE — prints the pid of our running instance, or returns 1.
# Trusts the pid file only if that process still carries our marker; if the pid
# file is missing or stale, looks for a java process carrying the marker.
engine_pid() {
  pid_by_marker "$(engine_pidfile "$1")" "$(engine_marker "$1")"
}

# pid_by_marker PIDFILE MARKER — prints the pid of the java process carrying MARKER (the pid
# file's if it still does, else any), or returns 1. engine_pid and cluster.sh's node_pid.
pid_by_marker() {
  local pidfile="$1" marker="$2" pid d
  if [[ -f "$pidfile" ]]; then
    pid="$(<"$pidfile")"
    if pid_matches "$pid" "$marker"; then
      printf '%s\n' "$pid"
      return 0
    fi
  fi
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [[ "$(readlink "$d/exe" 2>/dev/null)" == */java ]] || continue
    if pid_matches "$pid" "$marker"; then
      printf '%s\n' "$pid"
      return 0
    fi
  done
  return 1
}

# port_open PORT [HOST] — true if something accepts TCP connections on
# HOST:PORT (HOST default 127.0.0.1).
port_open() {
  # shellcheck disable=SC2016 # $1 and $2 are expanded by the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$2/$1"' _ "$1" "${2:-127.0.0.1}" 2>/dev/null
}

# rss_mib PID — resident set size of PID in MiB.
rss_mib() {
  local kb
  kb="$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)"
  printf '%s\n' "$(((${kb:-0} + 512) / 1024))"
}

# safe_wipe DIR — rm -rf DIR, refusing obviously dangerous paths.
safe_wipe() {
  local dir="$1"
  [[ -n "$dir" && "$dir" == /* ]] || die "refusing to wipe non-absolute path '$dir'"
  case "${dir%/}" in
    "" | / | /root | /home | /tmp | /usr | /var | /etc | "$HOME" | "$SLUICE_ENGINES_CACHE")
      die "refusing to wipe '$dir'"
      ;;
  esac
  rm -rf -- "$dir"
}

# kafka_tool CLASS ARG... — runs a Kafka command-line class (TopicCommand,
# ConsoleProducer, ...) from the cached jars with a small, quick-starting JVM.
kafka_tool() {
  local cls="$1"
  shift
  [[ -d "$SLUICE_KAFKA_LIB" ]] || die "Kafka jars missing: run scripts/engines/install.sh kafka"
  java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ENGINES_DIR/conf/tools-log4j2.xml" \
    -cp "$SLUICE_KAFKA_LIB/*" "$cls" "$@"
}

# stop_engine ENGINE — SIGTERM our instance, wait for it to exit (Kafka 30 s,
# Cassandra 60 s: both flush on a clean shutdown), then SIGKILL; removes the pid
# file. Quiet success if it is not running.
stop_engine() {
  local engine="$1" pid grace waited=0
  case "$engine" in
    kafka) grace="${SLUICE_KAFKA_STOP_GRACE:-30}" ;;
    cassandra | cassandra-tls) grace="${SLUICE_CASSANDRA_STOP_GRACE:-60}" ;;
  esac
  if ! pid="$(engine_pid "$engine")"; then
    say "$engine: not running"
    rm -f "$(engine_pidfile "$engine")"
    return 0
  fi
  say "$engine: stopping pid $pid (SIGTERM, up to ${grace} s)"
  kill -TERM "$pid" 2>/dev/null || true
  # pid_matches is false for a zombie (empty cmdline), so this also ends when
  # the process has exited but is not yet reaped by its parent.
  while pid_matches "$pid" "$(engine_marker "$engine")" && ((waited < grace * 2)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  if pid_matches "$pid" "$(engine_marker "$engine")"; then
    say "$engine: still alive after ${grace} s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    waited=0
    while pid_matches "$pid" "$(engine_marker "$engine")" && ((waited < 20)); do
      sleep 0.5
      waited=$((waited + 1))
    done
    pid_matches "$pid" "$(engine_marker "$engine")" && die "$engine: pid $pid survived SIGKILL"
  fi
  # Its cmdline empties early in exit; wait until it is reaped or a zombie, by
  # which point its sockets are closed and the ports are free again.
  waited=0
  while ! proc_exited "$pid" && ((waited < 20)); do
    sleep 0.5
    waited=$((waited + 1))
  done
  rm -f "$(engine_pidfile "$engine")"
  say "$engine: stopped"
}

# ensure_pki — the test CA and certificates in $SLUICE_ENGINES_PKI, made once
# and kept while valid for another day (a running engine keeps using them):
#   ca.pem/ca.key            the CA (what clients trust)
#   server.pem/server.key    localhost + 127.0.0.1, signed by the CA;
#   server.p12               the same as a PKCS#12 keystore (Kafka, Cassandra)
#   client.pem/client.key    a client certificate (CN=sluice-client)
#   truststore.p12           the CA for Cassandra's client-certificate check
# Store password: $SLUICE_ENGINES_PKI_PASSWORD (default sluice-test).
ensure_pki() {
  local pki="$SLUICE_ENGINES_PKI" pass="${SLUICE_ENGINES_PKI_PASSWORD:-sluice-test}" tmp
  if [[ -s "$pki/truststore.p12" ]] &&
    openssl x509 -checkend 86400 -noout -in "$pki/server.pem" >/dev/null 2>&1; then
    return 0
  fi
  command -v openssl >/dev/null || die "openssl not found (needed for the TLS test engines; SLUICE_ENGINES_TLS=0 leaves them out)"
  command -v keytool >/dev/null || die "keytool not found (part of the JDK; needed for the TLS test engines)"
  say "pki: making a test CA and certificates in $pki"
  tmp="$(mktemp -d "${pki%/}.XXXXXX")"
  (
    cd "$tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 365 \
      -subj "/CN=Sluice test CA" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign"
    for who in server client; do
      openssl req -newkey rsa:2048 -nodes -keyout "$who.key" -out "$who.csr" -subj "/CN=sluice-$who"
    done
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "extendedKeyUsage=serverAuth" \
      "basicConstraints=CA:FALSE" >server.ext
    printf '%s\n' "extendedKeyUsage=clientAuth" "basicConstraints=CA:FALSE" >client.ext
    for who in server client; do
      openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -out "$who.pem" -days 365 -extfile "$who.ext"
    done
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name server \
      -out server.p12 -passout "pass:$pass"
    keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 \
      -storetype PKCS12 -storepass "$pass"
    rm -f ./*.csr ./*.ext ./*.srl
    chmod 600 ./*.key
  ) >"$tmp.log" 2>&1 || { cat "$tmp.log" >&2; rm -rf -- "$tmp" "$tmp.log"; die "pki: making the certificates failed"; }
  rm -f -- "$tmp.log"
  [[ -d "$pki" ]] && safe_wipe "$pki"
  mv -- "$tmp" "$pki"
}

# cassandra_jvm_opts RUN JMX_PORT HEAP HEAP_MIN — sets the global array
# CASSANDRA_OPTS to the JVM options of a Cassandra node whose config, data and
# logs are under RUN (RUN/conf/cassandra.yaml, RUN/conf/logback.xml), with
# -Xmx HEAP, -Xms HEAP_MIN and local JMX on JMX_PORT. Shared by start.sh (one
# node) and cluster.sh (three).
cassandra_jvm_opts() {
  local run="$1" jmx_port="$2" heap="$3" heap_min="$4" jamm
  jamm="$(compgen -G "$SLUICE_CASSANDRA_LIB/jamm-*.jar" | head -n 1)" ||
    die "cassandra: jamm jar missing from $SLUICE_CASSANDRA_LIB (rerun install.sh cassandra)"
  CASSANDRA_OPTS=(
    -Xms"$heap_min" -Xmx"$heap"
    # conf/jvm-server.options, minus AlwaysPreTouch, UseBiasedLocking and the
    # heap dump (a 1 GB file per OOM); a test engine should just die on OOM.
    -ea -da:net.openhft... -XX:+UseThreadPriorities -XX:+ExitOnOutOfMemoryError
    -Xss256k -XX:+UseTLAB -XX:+ResizeTLAB -XX:+UseNUMA
    -XX:+PerfDisableSharedMem -Djava.net.preferIPv4Stack=true
    # conf/jvm17-server.options: GC flags, then the JPMS flags (required).
    -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1 -XX:G1HeapRegionSize=16m
    -XX:G1RSetUpdatingPauseTimePercent=5 -XX:MaxGCPauseMillis=300 -XX:InitiatingHeapOccupancyPercent=70
    -Djdk.attach.allowAttachSelf=true
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
    --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
    --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
    --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
    --add-exports java.sql/java.sql=ALL-UNNAMED
    --add-exports java.base/java.lang.ref=ALL-UNNAMED
    --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
    --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
    --add-opens java.base/java.lang.module=ALL-UNNAMED
    --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
    --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
    --add-opens java.base/jdk.internal.math=ALL-UNNAMED
    --add-opens java.base/jdk.internal.module=ALL-UNNAMED
    --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
    --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens java.base/java.io=ALL-UNNAMED
    --add-opens java.base/java.lang.reflect=ALL-UNNAMED
    --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
    --add-opens java.base/java.lang=ALL-UNNAMED
    --add-opens java.base/java.util=ALL-UNNAMED
    --add-opens java.base/java.nio=ALL-UNNAMED
    --add-opens java.base/java.nio.charset=ALL-UNNAMED
    -Dio.netty.tryReflectionSetAccessible=true
    -Dio.netty.allocator.useCacheForAllThreads=true -Dio.netty.allocator.maxOrder=11
    # What bin/cassandra + cassandra-env.sh would pass.
    -javaagent:"$jamm"
    -Dcassandra.config="file://$run/conf/cassandra.yaml"
    -Dcassandra-foreground=yes
    -Dcassandra.storagedir="$run/data"
    -Dcassandra.logdir="$run/logs"
    -Dlogback.configurationFile="$run/conf/logback.xml"
    -Dcassandra.jmx.local.port="$jmx_port"
    -Djava.io.tmpdir="$run/tmp" -Djna.tmpdir="$run/tmp"
  )
}

# kafka_write_logging RUN GENERATOR — the broker's log4j2.xml (a file of its own under RUN/logs,
# the chattiest loggers at WARN) and the readiness probe's client settings (fail fast, retry
# from the script), written by start.sh and cluster.sh alike.
kafka_write_logging() {
  local run="$1" generator="$2"
  cat >"$run/conf/log4j2.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/engines/${generator} -->
<Configuration status="WARN">
  <Appenders>
    <File name="server" fileName="${run}/logs/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
  </Loggers>
</Configuration>
EOF
  cat >"$run/conf/probe-client.properties" <<EOF
request.timeout.ms=5000
default.api.timeout.ms=10000
EOF
}

# cassandra_write_logging RUN GENERATOR — the node's logback.xml: INFO to RUN/logs/system.log,
# which the ready checks read. Written by start.sh and cluster.sh alike.
cassandra_write_logging() {
  local run="$1" generator="$2"
  cat >"$run/conf/logback.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/engines/${generator} -->
<configuration scan="false">
  <appender name="SYSTEMLOG" class="ch.qos.logback.core.FileAppender">
    <file>${run}/logs/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="SYSTEMLOG"/></root>
</configuration>
EOF
}

# cassandra_common_yaml RUN — the cassandra.yaml settings every test node shares, start.sh's
# single nodes and cluster.sh's three alike: directories under RUN, durability, Paxos.
cassandra_common_yaml() {
  local run="$1"
  cat <<EOF
start_native_transport: true
auto_bootstrap: false
# Periodic sync, as Cassandra's default: a kill -9 of the process loses nothing
# (the commit log is in the page cache); only a machine crash could.
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_disk_access_mode: legacy
data_file_directories:
  - ${run}/data/data
commitlog_directory: ${run}/data/commitlog
hints_directory: ${run}/data/hints
saved_caches_directory: ${run}/data/saved_caches
cdc_raw_directory: ${run}/data/cdc_raw
# Tests drop and truncate a lot: no snapshots for that.
auto_snapshot: false
# Paxos v2 (Cassandra 4.1+): an LWT in two round trips to the replicas instead of four,
# closer to what ScyllaDB does. The recommended setting for new clusters.
paxos_variant: v2
EOF
}

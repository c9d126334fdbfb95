#!/usr/bin/env bash
# Runs Sluice's whole test suite: formatting, lints, and every test of the workspace, with the
# real engines the integration suites need (started here, stopped at the end).
# The build is cached outside the clone (CARGO_TARGET_DIR, default ~/.cache/sluice/target).
# Ends with one summary line: "N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A CI checkout is built once: incremental artifacts would only fill the cache's disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"; fi
log="$(mktemp -t sluice-test.XXXXXX)"

# The CQL ledger's and the Kafka bus's suites run against a real Apache Cassandra 5 and Apache
# Kafka (KRaft), installed from Maven Central into ~/.cache/sluice/engines and started here on
# loopback (scripts/engines). Set SLUICE_SKIP_ENGINES=1 to run everything else without them.
engines="all"
# The cluster test (tests/tests/cluster.rs) runs last, on the 3-node clusters of
# scripts/engines/cluster.sh; SLUICE_SKIP_CLUSTER=1 (or SLUICE_SKIP_ENGINES=1) leaves it out.
cluster_test=replicas_of_every_service_survive_node_loss_on_three_node_clusters
cluster_started=0
emulators_started=0
cleanup() {
  if [ "$cluster_started" = 1 ]; then scripts/engines/cluster.sh stop >/dev/null 2>&1 || true; fi
  if [ "$emulators_started" = 1 ]; then scripts/emulators/stop.sh >/dev/null 2>&1 || true; fi
  if [ "${SLUICE_SKIP_ENGINES:-0}" != 1 ]; then
    scripts/engines/stop.sh $engines >/dev/null 2>&1 || true
    scripts/engines/kafka-secure.sh stop >/dev/null 2>&1 || true
  fi
  rm -f "$log"
}
trap cleanup EXIT
if [ "${SLUICE_SKIP_ENGINES:-0}" = 1 ]; then
  export SLUICE_SKIP_CQL=1 SLUICE_SKIP_KAFKA=1 SLUICE_SKIP_CLUSTER=1
else
  echo "== engines: $engines"
  scripts/engines/install.sh $engines
  scripts/engines/start.sh $engines
  # The authorizing broker of the access tests (tests/tests/kafka_access.rs, which would start
  # it too): StandardAuthorizer, SASL users, an OAUTHBEARER listener; ports 29092-29094.
  scripts/engines/kafka-secure.sh start
fi
# shellcheck source=engines/env.sh
. scripts/engines/env.sh

# The trace test (tests/tests/traces.rs) exports to a real OpenTelemetry Collector, built once
# from the Go module proxy into ~/.cache/sluice/otelcol (scripts/otelcol/install.sh); the test
# starts it on a free loopback port and stops it. Without it (no Go, no proxy, or
# SLUICE_SKIP_OTELCOL=1) that test says it is skipped and the rest runs.
if [ "${SLUICE_SKIP_OTELCOL:-0}" != 1 ]; then
  echo "== OpenTelemetry Collector (scripts/otelcol/install.sh)"
  if otelcol="$(scripts/otelcol/install.sh | tail -n 1)" && [ -x "$otelcol" ]; then
    export SLUICE_OTELCOL_BIN="$otelcol"
  else
    echo "no OpenTelemetry Collector could be built: the trace export test is skipped"
  fi
fi

echo "== deploy/ and k8s/ (scripts/check-deploy.sh)"
scripts/check-deploy.sh >"$log" 2>&1 || { cat "$log"; exit 1; }
tail -n 1 "$log"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== the services' job shape (scripts/check-job-shape.sh)"
scripts/check-job-shape.sh
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo build --bins (the distributed test starts the service binaries)"
cargo build --workspace --bins --locked

# The examples' tests (tests/tests/examples.rs, and localstripe's webhooks in
# tests/tests/evidence.rs) call four API emulators nobody here wrote —
# localstripe, Mailpit, json-server and moto — installed from PyPI, the Go module proxy and npm
# into ~/.cache/sluice/emulators and started on loopback for the cargo tests only
# (scripts/emulators; their addresses are exported as SLUICE_EMU_*_URL), and run the Stripe
# adapter under a Python with Sluice's SDK (examples/stripe/venv.sh). SLUICE_SKIP_EMULATORS=1
# runs everything else without them.
if [ "${SLUICE_SKIP_EMULATORS:-0}" = 1 ]; then
  echo "== emulators: SLUICE_SKIP_EMULATORS=1, the examples' tests against them are skipped"
else
  echo "== emulators (scripts/emulators/start.sh) and the Stripe adapter's Python"
  emulators_began=$SECONDS
  emulators_env="$(scripts/emulators/start.sh)"
  emulators_started=1
  eval "$emulators_env"
  SLUICE_EXAMPLES_PYTHON="$(examples/stripe/venv.sh)"
  export SLUICE_EXAMPLES_PYTHON
  echo "emulators and Python ready: $((SECONDS - emulators_began)) s"
fi
echo "== cargo test"
set +e
# The cluster test runs on its own below, on the clusters, not here beside the single nodes.
cargo test --workspace --locked --no-fail-fast -- --skip "$cluster_test" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$emulators_started" = 1 ]; then
  scripts/emulators/stop.sh >/dev/null 2>&1 || echo "scripts/emulators/stop.sh failed"
  emulators_started=0
fi

# The other languages' suites (SDKs, the browser, the API fuzzer): every scripts/suites/*.sh
# runs after cargo's, against the binaries just built (SLUICE_BIN), and ends its output with
# one "N passed, N failed, N skipped" line, summed into the closing line below.
export SLUICE_BIN="$CARGO_TARGET_DIR/debug/sluice"
# The SDKs' release files (the Python wheel and sdist, the npm tarball), built once here: the
# SDK suites install them, and the release suite packages these same files with the binaries
# (scripts/release.sh --keep-sdks; docs/release.md). A failure here shows in those suites,
# which try again and fail saying why.
export SLUICE_DIST="$PWD/dist"
echo "== the SDKs' release files (scripts/release.sh --sdks-only)"
suites="$(mktemp -t sluice-suites.XXXXXX)"
scripts/release.sh --sdks-only --dist "$SLUICE_DIST" >"$suites.one" 2>&1 \
  && echo "built and checked: $(ls "$SLUICE_DIST" | tr "\n" " ")" || { cat "$suites.one"; echo "scripts/release.sh --sdks-only failed"; }
for suite in scripts/suites/*.sh; do
  [ -e "$suite" ] || continue
  echo "== $suite"
  set +e
  bash "$suite" 2>&1 | tee "$suites.one"
  suite_status=${PIPESTATUS[0]}
  set -e
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$suites.one" | tail -n 1)"
  if [ -z "$line" ]; then
    echo "$suite printed no summary line: counted as one failure"
    line="0 passed, 1 failed, 0 skipped"
  elif [ "$suite_status" != 0 ] && [ "$(echo "$line" | awk '{print $3}')" = 0 ]; then
    echo "$suite exited $suite_status with no failed test: counted as one failure"
    line="$(echo "$line" | awk '{printf "%d passed, 1 failed, %d skipped", $1, $5}')"
  fi
  echo "$line" >>"$suites"
  if [ "$suite_status" != 0 ] && [ "$status" = 0 ]; then status=$suite_status; fi
done
rm -f "$suites.one"

# The agent's call (one agent per connection, `Prefer: wait`, C = 1, 16, 64, 256), a short row
# each on the build just made, printed beside the figures last recorded for that build in
# docs/agent-bench-ci.json: so a slower agent's call shows in the next CI log. Figures, never a
# pass or a fail (the VM drifts by a fifth); docs/performance-history.md says how to measure one.
echo "== the agent's call (scripts/bench-agents-ci.py)"
scripts/bench-agents-ci.py --bin "$SLUICE_BIN" || echo "the agent bench did not finish: no figures this time (not a test)"

# The cluster test: 2 replicas of each service on a 3-node Cassandra and a 3-broker Kafka, nodes
# and replicas killed mid-flight. Six more JVMs do not fit beside the single-node engines on two
# cores, so those (this script's own) stop first; the clusters stop when the test is done.
if [ "${SLUICE_SKIP_CLUSTER:-0}" != 1 ]; then
  echo "== cluster test (scripts/engines/cluster.sh, tests/tests/cluster.rs)"
  cluster_began=$SECONDS
  scripts/engines/stop.sh $engines
  scripts/engines/kafka-secure.sh stop
  cluster_started=1
  set +e
  cluster_env="$(scripts/engines/cluster.sh start)"
  cluster_status=$?
  set -e
  echo "cluster start: $((SECONDS - cluster_began)) s (exit $cluster_status)"
  if [ "$cluster_status" = 0 ]; then
    eval "$cluster_env"
    test_began=$SECONDS
    set +e
    # --workspace, as the main run: the same feature set, so nothing is built again.
    cargo test --locked --workspace --test cluster -- --nocapture 2>&1 | tee -a "$log"
    cluster_status=${PIPESTATUS[0]}
    set -e
    echo "cluster test: $((SECONDS - test_began)) s (exit $cluster_status)"
  else
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored (the clusters did not start)" | tee -a "$log"
  fi
  scripts/engines/cluster.sh stop
  cluster_started=0
  echo "cluster step: $((SECONDS - cluster_began)) s in all"
  if [ "$cluster_status" != 0 ] && [ "$status" = 0 ]; then status=$cluster_status; fi
fi

# Sum cargo's per-binary "test result:" lines and the suites' lines into one closing line.
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/)  passed  += $i
            if ($(i+1) ~ /^failed/)  failed  += $i
            if ($(i+1) ~ /^ignored/) ignored += $i
        }
     }
     /^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$/ { passed += $1; failed += $3; ignored += $5 }
     END { printf "%d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log" "$suites"
rm -f "$suites"
exit "$status"

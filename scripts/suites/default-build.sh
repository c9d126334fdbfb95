#!/usr/bin/env bash
# The `sluice` binary as the README's first command builds it: default features, so without the
# distributed engines (no librdkafka, no OpenSSL, no ScyllaDB driver). The workspace's own build
# has every engine (the suites run them), so this is where the build a new user meets is
# checked: clippy on it, and the tests of sluice-assemble that only run without the engines (a
# configuration naming CQL or Kafka refused, naming the feature). Ends with one line
# `N passed, N failed, N skipped`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

failed=0
# The `sluice` binary's crates: the command line and the three that carry its commands out.
if ! cargo clippy -p sluice -p sluice-embedded -p sluice-cli -p sluice-mcp -p sluice-assemble \
  --all-targets --locked -- -D warnings; then
  echo "clippy of the default build failed"
  failed=1
fi
out="$(cargo test -p sluice-assemble --locked 2>&1)"
echo "$out"
passed=$(echo "$out" | awk '/^test result:/ {p += $4} END {print p + 0}')
test_failed=$(echo "$out" | awk '/^test result:/ {f += $6} END {print f + 0}')
skipped=$(echo "$out" | awk '/^test result:/ {s += $8} END {print s + 0}')
if ! echo "$out" | grep -q '^test result:'; then
  test_failed=$((test_failed + 1))
fi
echo "$((passed)) passed, $((test_failed + failed)) failed, $((skipped)) skipped"
[ $((test_failed + failed)) = 0 ]

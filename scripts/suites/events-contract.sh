#!/usr/bin/env bash
# The public event contract (docs/events.md): schemas/asyncapi.yaml validated by the AsyncAPI
# parser (npm @asyncapi/parser), and the two consumer examples of examples/consumers — Python
# (confluent-kafka, jsonschema) and TypeScript (kafkajs, ajv) — run against the real Kafka of
# scripts/engines, reading the events a real Sluice ($SLUICE_BIN, Kafka bus, SQLite ledger)
# published, a duplicate delivery included (tests/events-contract/run.py). The consumers are
# skipped, saying so, with SLUICE_SKIP_KAFKA=1. Installs its tools under ~/.cache/sluice and
# ends with one "N passed, N failed, N skipped" line.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="$HOME/.cache/sluice"
export SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$cache/target}/debug/sluice}"
# shellcheck source=../engines/env.sh
. scripts/engines/env.sh

# The Python example's requirements (PyPI), in a venv of their own.
venv="$cache/venv-events-consumer"
requirements="examples/consumers/python/requirements.txt"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$requirements" "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$venv/requirements.txt"
fi

# The TypeScript example, installed from its lock file (npm) and built, outside the clone.
ts="$cache/events-consumer-ts"
mkdir -p "$ts"
if ! cmp -s examples/consumers/typescript/package-lock.json "$ts/package-lock.json"; then
  rm -rf "$ts/node_modules"
  cp examples/consumers/typescript/package.json examples/consumers/typescript/package-lock.json "$ts/"
  (cd "$ts" && npm ci --no-audit --no-fund --ignore-scripts --silent)
fi
rm -rf "$ts/src" "$ts/dist"
cp -r examples/consumers/typescript/src examples/consumers/typescript/tsconfig.json "$ts/"
(cd "$ts" && npx --no-install tsc -p tsconfig.json)

# The AsyncAPI parser, beside its validation script.
validator="$cache/events-contract"
mkdir -p "$validator"
if ! cmp -s tests/events-contract/package-lock.json "$validator/package-lock.json"; then
  rm -rf "$validator/node_modules"
  cp tests/events-contract/package.json tests/events-contract/package-lock.json "$validator/"
  (cd "$validator" && npm ci --no-audit --no-fund --ignore-scripts --silent)
fi
cp tests/events-contract/validate-asyncapi.mjs "$validator/"

exec python3 tests/events-contract/run.py "$venv/bin/python" "$ts/dist" "$validator"

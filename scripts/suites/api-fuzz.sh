#!/usr/bin/env bash
# Fuzzes the live API against schemas/openapi.yaml with schemathesis (PyPI): every operation,
# every check (server errors, status codes, content types, headers, response schemas,
# schema-valid requests refused and schema-violating ones accepted, Allow headers, auth).
# The SDKs' types are generated from the document, so it must be exactly true.
#
# Starts the demo upstream and `sluice dev` on loopback with an admin token, seeds one run the
# document's examples name (so the per-run operations reach real data), and ends with one
# "N passed, N failed, N skipped" line: one test per operation, failed when schemathesis
# reports a failure or an error for it. SLUICE_FUZZ_SEED picks the seed (fixed by default, so
# CI is repeatable; set another to explore), SLUICE_FUZZ_EXAMPLES the cases per operation.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="$HOME/.cache/sluice/venv-fuzz"
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/fuzz/requirements.txt
fi
bin="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}/debug/sluice}"
work="$(mktemp -d -t sluice-fuzz.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
upstream_port="$(free_port)"
"$bin" bench-upstream --listen "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
sed "s#http://127.0.0.1:8787#http://127.0.0.1:$upstream_port#" deploy/catalog.toml >"$work/catalog.toml"
port="$(free_port)"
token="fuzz-admin-token-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
cat >"$work/sluice.toml" <<TOML
[ledger]
data_dir = "$work/ledger"
durability = "normal"
[catalog]
path = "$work/catalog.toml"
[producer]
listen = "127.0.0.1:$port"
# A fuzzed long poll on a command that never settles would hold its request this long.
max_wait_ms = 2000
[[auth.tokens]]
name = "fuzz-admin"
role = "admin"
token = "$token"
TOML
"$bin" dev --config "$work/sluice.toml" --log-level error >"$work/dev.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$port"
for _ in $(seq 1 300); do
  curl -fs "$url/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "$url/healthz" >/dev/null || { cat "$work/dev.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

# The run the document's examples name: an email (CONFIRMED) and a wire waiting for approval.
submit() {
  curl -fs -o /dev/null -X POST "$url/v1/effects" -H "authorization: Bearer $token" \
    -H 'content-type: application/json' -H 'prefer: wait=10' -d "$1"
}
submit '{"run_id":"r-example","decision":1,"tool":"email/send","call_idx":0,"args":{"to":"a@example.com","subject":"hi","body":"hello"}}'
submit '{"run_id":"r-example","decision":2,"tool":"payments/wire","call_idx":0,"args":{"account":"acc-1","amount_minor":2000000,"beneficiary":"b-1","date":"2026-11-25"}}'

set +e
"$venv/bin/schemathesis" --config-file tests/fuzz/schemathesis.toml run schemas/openapi.yaml \
  --url "$url" \
  --header "Authorization: Bearer $token" \
  --checks all \
  --max-examples "${SLUICE_FUZZ_EXAMPLES:-40}" \
  --seed "${SLUICE_FUZZ_SEED:-20261125}" \
  --workers 1 \
  --request-timeout 30 \
  --report junit --report-junit-path "$work/junit.xml" \
  --no-color 2>&1 | grep -v '^$'
status=${PIPESTATUS[0]}
set -e
python3 - "$work/junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.iter("testcase")
total = failed = skipped = 0
for case in cases:
    total += 1
    if case.find("failure") is not None or case.find("error") is not None:
        failed += 1
    elif case.find("skipped") is not None:
        skipped += 1
print(f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped")
PY
exit "$status"

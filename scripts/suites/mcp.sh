#!/usr/bin/env bash
# `sluice mcp` driven by the official MCP Python SDK (PyPI `mcp`) over stdio and streamable
# HTTP, both eras (the handshake, and MCP 2026-07-28 without sessions), and by the official
# TypeScript SDK (npm `@modelcontextprotocol/sdk`, tests/mcp/ts), against a real `sluice dev`
# (tests/mcp). Installs its tools into a venv under ~/.cache/sluice and the TypeScript SDK with
# `npm ci` from the committed lockfile (npm's cache in ~/.cache/sluice/npm); needs Node 20+.
# Ends with one "N passed, N failed, N skipped" line.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="$HOME/.cache/sluice/venv-mcp"
if [ ! -x "$venv/bin/pytest" ] || ! "$venv/bin/python" -c 'import mcp, anyio' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
fi
ts=tests/mcp/ts
if [ ! -d "$ts/node_modules/@modelcontextprotocol/sdk" ] || [ "$ts/package-lock.json" -nt "$ts/node_modules/.package-lock.json" ]; then
  (cd "$ts" && npm_config_cache="${npm_config_cache:-$HOME/.cache/sluice/npm}" \
    npm ci --no-audit --no-fund --silent --update-notifier=false) || echo "mcp: npm ci in $ts failed; the TypeScript SDK's tests will fail" >&2
fi
export SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}/debug/sluice}"
report="$(mktemp -t sluice-mcp.XXXXXX.xml)"
trap 'rm -f "$report"' EXIT
set +e
"$venv/bin/pytest" -q -p no:cacheprovider --junitxml="$report" tests/mcp
status=$?
set -e
"$venv/bin/python" - "$report" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
total = sum(int(s.get("tests", 0)) for s in suites)
failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped")
PY
exit "$status"

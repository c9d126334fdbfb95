#!/usr/bin/env bash
# The MCP gateway against MCP servers nobody here wrote (tests/mcp-gateway): mcp-server-git
# (PyPI), @modelcontextprotocol/server-memory and -filesystem (npm), installed pinned by
# scripts/mcp-servers/install.sh, behind a real `sluice dev` ($SLUICE_BIN), with the fault wrapper
# and fault proxy of tests/mcp-gateway/faults between them. Its Python tools go into a venv under
# ~/.cache/sluice (shared with tests/mcp: the same pins). Ends with one "N passed, N failed,
# N skipped" line.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="$HOME/.cache/sluice/venv-mcp"
if [ ! -x "$venv/bin/pytest" ] || ! "$venv/bin/python" -c 'import mcp, anyio' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp-gateway/requirements.txt
fi
SLUICE_MCP_SERVERS_BIN="$(scripts/mcp-servers/install.sh | tail -n 1)"
export SLUICE_MCP_SERVERS_BIN
export SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}/debug/sluice}"
report="$(mktemp -t sluice-mcp-gateway.XXXXXX.xml)"
trap 'rm -f "$report"' EXIT
set +e
# Bounded: a hung server or gateway must not hold CI (the suite takes well under 3 minutes).
timeout 600 "$venv/bin/pytest" -q -p no:cacheprovider --junitxml="$report" tests/mcp-gateway
status=$?
set -e
if [ ! -s "$report" ]; then
  echo "the suite was stopped before pytest wrote its report (exit $status)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
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

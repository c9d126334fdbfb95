#!/usr/bin/env bash
# The README's examples in the order the README gives them, against one `sluice upstream` and
# one `sluice dev` (tests/readme): the curl tour with real curl, the Python quickstart twice
# with a virtualenv holding ./sdk/python, the TypeScript quickstart twice with node against
# sdk/typescript, and the MCP snippet's `sluice mcp` driven by the official MCP Python SDK;
# then the demo upstream must hold exactly the effects they made. Installs from PyPI and npm
# into ~/.cache/sluice; needs python3 (3.11+), node 20+ with npm, and curl 7.82+ (`--json`).
# Ends with one line "N passed, N failed, N skipped".
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
tools="$HOME/.cache/sluice/venv-readme"      # pytest and the MCP SDK (tests/mcp's pins)
sdk="$HOME/.cache/sluice/venv-readme-sdk"    # only what the README installs: ./sdk/python
report="$(mktemp -t sluice-readme.XXXXXX.xml)"
trap 'rm -f "$report"' EXIT

fail_setup() {
  echo "readme: $1"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail_setup "python3 is $(python3 --version 2>&1); the SDK needs 3.11 or newer"
for tool in node npm curl; do
  command -v "$tool" >/dev/null || fail_setup "$tool is needed (Node 20+ with npm, curl 7.82+)"
done
export SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}/debug/sluice}"
[ -x "$SLUICE_BIN" ] || fail_setup "no sluice binary at $SLUICE_BIN (cargo build -p sluice)"

if [ ! -x "$tools/bin/pytest" ] || ! "$tools/bin/python" -c 'import mcp, anyio' 2>/dev/null; then
  rm -rf "$tools"
  python3 -m venv "$tools" || fail_setup "could not create the virtualenv $tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt \
    || fail_setup "could not install tests/mcp/requirements.txt from PyPI"
fi
# As the README says: `python3 -m venv .venv && .venv/bin/pip install ./sdk/python`. This
# checkout's package is reinstalled each time (not editable); its dependencies only when
# `pip check` finds them missing.
if [ ! -x "$sdk/bin/python" ]; then
  python3 -m venv "$sdk" || fail_setup "could not create the virtualenv $sdk"
fi
"$sdk/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps ./sdk/python \
  || fail_setup "could not install ./sdk/python"
if ! "$sdk/bin/pip" check >/dev/null 2>&1; then
  "$sdk/bin/pip" install --quiet --disable-pip-version-check ./sdk/python \
    || fail_setup "could not install ./sdk/python's dependencies from PyPI"
fi
export SLUICE_README_PYTHON="$sdk/bin/python"

# As the README says: `(cd sdk/typescript && npm ci && npm run build)`: `npm ci` when its
# dependencies are not installed yet, the build when dist/ is missing or older than a source.
export npm_config_cache="${npm_config_cache:-$HOME/.cache/sluice/npm}"
export npm_config_update_notifier=false
(
  cd sdk/typescript || exit 1
  if [ ! -e node_modules/.bin/tsc ] || [ ! -d node_modules/standardwebhooks ]; then
    npm ci --no-audit --no-fund --silent || exit 1
  fi
  if [ ! -e dist/index.js ] || [ -n "$(find src package.json tsconfig.json -newer dist/index.js | head -n 1)" ]; then
    npm run --silent build
  fi
) || fail_setup "could not build sdk/typescript (npm ci && npm run build)"

set +e
"$tools/bin/pytest" -q -p no:cacheprovider --junitxml="$report" tests/readme
status=$?
set -e

"$tools/bin/python" - "$report" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET

report, status = sys.argv[1], int(sys.argv[2])
try:
    root = ET.parse(report).getroot()
except (OSError, ET.ParseError):
    print("0 passed, 1 failed, 0 skipped")
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
count = lambda name: sum(int(s.get(name, 0)) for s in suites)
tests, skipped = count("tests"), count("skipped")
failed = count("failures") + count("errors")
if status not in (0, 1) and failed == 0:
    failed = 1  # pytest itself failed (usage error, interrupted, no tests collected)
print(f"{tests - skipped - count('failures') - count('errors')} passed, {failed} failed, {skipped} skipped")
PY
exit "$status"

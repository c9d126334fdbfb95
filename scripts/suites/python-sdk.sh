#!/usr/bin/env bash
# The Python SDK's suite (sdk/python): a virtualenv under ~/.cache/sluice/ with the package and
# its test extra installed from PyPI, then pytest against the real binaries (`sluice dev` from
# $SLUICE_BIN, tool upstreams served by uvicorn). Needs only python3 (3.11+) and PyPI.
# Ends with one line "N passed, N failed, N skipped" (from pytest's JUnit XML).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${SLUICE_PYTHON_SDK_VENV:-$HOME/.cache/sluice/venv-python-sdk}"
report="$(mktemp -t sluice-python-sdk.XXXXXX.xml)"
trap 'rm -f "$report"' EXIT

fail_setup() {
  echo "python-sdk: $1"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail_setup "python3 is $(python3 --version 2>&1); the SDK needs 3.11 or newer"
if [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    # Debian's python3 leaves venv (ensurepip) to a package of its own.
    rm -rf "$venv"
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$venv" || fail_setup "could not create the virtualenv $venv (install python3-venv)"
  fi
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip \
  || fail_setup "could not upgrade pip in $venv"
# Not editable: the tests import the package as built from pyproject.toml, py.typed included.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "$root/sdk/python" && "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "$root/sdk/python[test]" || fail_setup "could not install sdk/python[test] from PyPI"

cd "$root/sdk/python" || fail_setup "no sdk/python"
"$venv/bin/python" -m pytest -p no:cacheprovider -q --junitxml="$report" tests
status=$?

"$venv/bin/python" - "$report" "$status" <<'PY'
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

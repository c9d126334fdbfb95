#!/usr/bin/env bash
# The Python SDK's suite (sdk/python): a virtualenv under ~/.cache/sluice/ with the SDK installed
# from the wheel scripts/release.sh builds (the file a user installs, not the source directory;
# scripts/test.sh builds it once before the suites, into $SLUICE_DIST, else this suite does) and
# its test extra from PyPI, and the agent frameworks its adapters are tested with
# (sdk/python/tests/frameworks.txt: the OpenAI Agents SDK, LangGraph), then pytest on
# sdk/python/tests against the real binaries (`sluice dev` from $SLUICE_BIN, tool upstreams
# served by uvicorn; the adapters' examples in examples/agents run there too). Needs only
# python3 (3.11+) and PyPI.
# Ends with one line "N passed, N failed, N skipped" (from pytest's JUnit XML).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${SLUICE_PYTHON_SDK_VENV:-$HOME/.cache/sluice/venv-python-sdk}"
report="$(mktemp -t sluice-python-sdk.XXXXXX.xml)"
trap 'rm -f "$report" "$report.release"' EXIT

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
# The wheel of the release (made here if scripts/test.sh has not made it from these sources).
dist="${SLUICE_DIST:-$root/dist}"
"$root/scripts/release.sh" --sdks-only --keep-sdks --dist "$dist" >"$report.release" 2>&1 \
  || { cat "$report.release"; fail_setup "scripts/release.sh --sdks-only failed"; }
wheels=("$dist"/sluice_sdk-*-py3-none-any.whl)
[ -f "${wheels[0]}" ] || fail_setup "no wheel in $dist"
echo "installing ${wheels[0]##*/}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "${wheels[0]}" && "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "${wheels[0]}[test]" || fail_setup "could not install ${wheels[0]##*/}[test] (its dependencies from PyPI)"
# The agent frameworks the adapters (sluice.adapters.*) are tested with, at the pinned versions.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r "$root/sdk/python/tests/frameworks.txt" \
  || fail_setup "could not install the agent frameworks of sdk/python/tests/frameworks.txt"

cd "$root/sdk/python" || fail_setup "no sdk/python"
# The tests must import the installed wheel, never src/ beside them.
where="$("$venv/bin/python" -c 'import sluice; print(sluice.__file__)')"
case "$where" in
  "$venv"/*) echo "the tests import $where" ;;
  *) fail_setup "the tests would import sluice from $where, not from the installed wheel" ;;
esac
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

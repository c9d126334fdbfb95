#!/usr/bin/env bash
# venv.sh — makes (or updates) the Python the Stripe adapter runs under: a virtualenv with
# Sluice's Python SDK from this repository (sdk/python: ToolApp, the signature checks) and
# uvicorn from PyPI, in $SLUICE_EXAMPLES_VENV (default ~/.cache/sluice/venv-examples). Prints
# the path of its python on stdout (progress on stderr). Needs python3 3.11 or newer.
#
#   PYTHON="$(examples/stripe/venv.sh)"
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${SLUICE_EXAMPLES_VENV:-$HOME/.cache/sluice/venv-examples}"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "venv.sh: python3 is $(python3 --version 2>&1); Sluice's SDK needs 3.11 or newer" >&2
  exit 1
}
if [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2 || {
    echo "venv.sh: could not create $venv (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
pip() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@" >&2; }
# The SDK as this checkout has it (reinstalled each time, without touching its dependencies),
# then its dependencies and uvicorn from PyPI when missing.
pip install --force-reinstall --no-deps "$root/sdk/python"
pip install "$root/sdk/python" "uvicorn>=0.30,<1"
echo "$venv/bin/python"

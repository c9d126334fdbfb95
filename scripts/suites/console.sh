#!/usr/bin/env bash
# The web console in a real browser: Debian's chromium driven by Playwright for Python, against
# a real `sluice dev` (admin, operator and two agent tokens) and the demo upstream, whose bank is
# made to misbehave during the run. Installs what it needs into ~/.cache/sluice (chromium from
# Debian's packages when missing; Playwright from PyPI into a venv; Playwright never downloads a
# browser here: it is launched with executable_path = Debian's chromium). Screenshots of each
# view go to $SLUICE_CONSOLE_SHOTS (default: <target>/console-shots). Ends with one line
# `N passed, N failed, N skipped`.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
SLUICE_BIN="${SLUICE_BIN:-$target/debug/sluice}"
cache="$HOME/.cache/sluice"
venv="$cache/console-venv"
shots="${SLUICE_CONSOLE_SHOTS:-$target/console-shots}"

give_up() {
  echo "console suite: $*" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}

[ -x "$SLUICE_BIN" ] || give_up "no sluice binary at $SLUICE_BIN (cargo build -p sluice, or set SLUICE_BIN)"

chromium="$(command -v chromium || true)"
if [ -z "$chromium" ]; then
  echo "installing Debian's chromium" >&2
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo"
  $as_root apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium >&2 \
    || give_up "cannot install chromium with apt-get"
  chromium="$(command -v chromium)" || give_up "chromium is not on PATH after installing it"
fi

if ! "$venv/bin/python" -c 'import playwright.sync_api' 2>/dev/null; then
  echo "installing Playwright for Python into $venv" >&2
  mkdir -p "$cache"
  python3 -m venv "$venv" >&2 && "$venv/bin/pip" install -q 'playwright>=1.45,<2' >&2 \
    || give_up "cannot install playwright from PyPI"
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

work="$(mktemp -d -t sluice-console.XXXXXX)"
upstream_pid=""
sluice_pid=""
cleanup() {
  [ -n "$sluice_pid" ] && kill "$sluice_pid" 2>/dev/null && wait "$sluice_pid" 2>/dev/null
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null && wait "$upstream_pid" 2>/dev/null
  if [ -n "${SLUICE_CONSOLE_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

upstream_port="$(free_port)"
api_port="$(free_port)"
"$SLUICE_BIN" bench-upstream --listen "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
upstream_pid=$!

# The example catalog on this upstream, with short horizons so a wire goes STUCK in seconds.
sed -e "s/127\.0\.0\.1:8787/127.0.0.1:$upstream_port/g" \
    -e 's/^max_checks = 5$/max_checks = 2/' \
    -e 's/^late_commit_ms = 10000$/late_commit_ms = 500/' \
    -e 's/^verify_after_ms = 30000$/verify_after_ms = 4000/' \
    "$repo/deploy/catalog.toml" >"$work/catalog.toml"
# A spend budget for the Budgets view: high enough that it never refuses a wire, so every wire
# is held against it and the view has amounts to show.
cat >>"$work/catalog.toml" <<'TOML'

[budgets.console_wires]
tools = ["payments/wire"]
scope = "tenant"
window = "day"
limits = { EUR = 100000000000 }
on_exceed = "require_approval"
TOML

cat >"$work/sluice.toml" <<TOML
[ledger]
data_dir = "$work/ledger"
durability = "normal"
[catalog]
path = "$work/catalog.toml"
[producer]
listen = "127.0.0.1:$api_port"
[reconciler]
sweep_interval_ms = 200
[telemetry]
log_level = "info"
[[auth.tokens]]
name = "console-admin"
role = "admin"
token = "console-admin-token-0123456789"
[[auth.tokens]]
name = "console-operator"
role = "operator"
token = "console-operator-token-0123456789"
[[auth.tokens]]
name = "agent-a"
role = "agent"
token = "console-agent-a-token-0123456789"
[[auth.tokens]]
name = "agent-b"
role = "agent"
token = "console-agent-b-token-0123456789"
TOML

"$SLUICE_BIN" dev --config "$work/sluice.toml" >"$work/sluice.log" 2>&1 &
sluice_pid=$!

ready=""
for _ in $(seq 1 100); do
  if python3 - "$api_port" "$upstream_port" <<'PY' 2>/dev/null; then ready=1; break; fi
import sys, urllib.request
for port, path in ((sys.argv[1], "/readyz"), (sys.argv[2], "/_stats")):
    urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1).read()
PY
  kill -0 "$sluice_pid" 2>/dev/null || break
  sleep 0.2
done
if [ -z "$ready" ]; then
  tail -n 30 "$work/sluice.log" "$work/upstream.log" >&2
  give_up "sluice dev or the upstream did not become ready"
fi

mkdir -p "$shots"
"$venv/bin/python" "$here/console/test_console.py" \
  --base "http://127.0.0.1:$api_port" \
  --upstream "http://127.0.0.1:$upstream_port" \
  --chromium "$chromium" \
  --ledger "$work/ledger" \
  --shots "$shots"
status=$?
echo "console screenshots: $shots" >&2
if [ "$status" -ne 0 ]; then
  echo "--- last lines of the sluice log ---" >&2
  tail -n 40 "$work/sluice.log" >&2
fi
exit "$status"

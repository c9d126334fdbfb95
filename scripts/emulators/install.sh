#!/usr/bin/env bash
# install.sh [localstripe|mailpit|json-server|moto|all ...] — installs the API emulators the
# examples' tests run against (default all) into $SLUICE_EMULATORS_CACHE (default
# ~/.cache/sluice/emulators), from the package registries with their ordinary clients:
#   localstripe 1.15.10    PyPI, into the venv ($SLUICE_EMULATORS_VENV)
#   moto[server] 5.2.5     PyPI, into the same venv
#   mailpit v1.33.1        Go module proxy: `go install` into $SLUICE_EMULATORS_BIN, with
#                          GOPATH, GOMODCACHE and GOCACHE under the cache too
#   json-server 0.17.4     npm registry: `npm install --prefix $SLUICE_EMULATORS_NODE`
# The download caches of pip and npm are under the cache dir as well, so nothing lands in the
# clone, ~/.cache/pip, ~/go or ~/.npm. Idempotent and quick: an emulator whose installed
# version is the wanted one is left alone. One line per emulator on stderr; each client's
# output goes to $SLUICE_EMULATORS_CACHE/logs/<name>-install.log (its tail is shown on failure).
# Needs: python3 (3.9+) with venv, go (1.26+; GOTOOLCHAIN=local, no toolchain download), node
# and npm.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
parse_emulators "$@" || { usage; exit 0; }

CACHE="$SLUICE_EMULATORS_CACHE"
VENV="$SLUICE_EMULATORS_VENV"
LOGS="$CACHE/logs"

# quietly LOG CMD... — runs CMD with its output in LOG (under $LOGS); on failure prints the
# log's tail and returns CMD's status.
quietly() {
  local log="$LOGS/$1" status=0
  shift
  mkdir -p "$LOGS"
  "$@" >"$log" 2>&1 || status=$?
  if ((status != 0)); then
    printf '[emulators] ---- last 30 lines of %s ----\n' "$log" >&2
    tail -n 30 "$log" >&2
  fi
  return "$status"
}

# ------------------------------------------------------------ Python (venv) --

# pip_requirement NAME, pip_version NAME — what pip installs for a Python emulator.
pip_requirement() {
  case "$1" in
    localstripe) echo "localstripe==$SLUICE_LOCALSTRIPE_VERSION" ;;
    # The server extra brings flask, flask-cors and the rest of moto_server.
    moto) echo "moto[server]==$SLUICE_MOTO_VERSION" ;;
  esac
}
pip_version() { case "$1" in localstripe) echo "$SLUICE_LOCALSTRIPE_VERSION" ;; moto) echo "$SLUICE_MOTO_VERSION" ;; esac; }

# venv_has NAME — true if the venv holds the wanted version (and, for moto, its server extra).
venv_has() {
  local probe
  [[ -x "$VENV/bin/python" ]] || return 1
  case "$1" in
    localstripe) probe='import importlib.metadata as m, sys; sys.exit(m.version("localstripe") != sys.argv[1])' ;;
    moto) probe='import importlib.metadata as m, sys; m.version("flask"); m.version("flask-cors"); sys.exit(m.version("moto") != sys.argv[1])' ;;
  esac
  "$VENV/bin/python" -c "$probe" "$(pip_version "$1")" >/dev/null 2>&1
}

install_python() {
  local name="$1" started=$SECONDS
  if venv_has "$name"; then
    say "$name $(pip_version "$name"): already installed (venv $VENV)"
    return 0
  fi
  command -v "$SLUICE_EMULATORS_PYTHON" >/dev/null || die "$SLUICE_EMULATORS_PYTHON not found (Python 3.9+ is needed for $name)"
  if [[ ! -x "$VENV/bin/python" ]]; then
    [[ -d "$VENV" ]] && safe_wipe "$VENV"
    "$SLUICE_EMULATORS_PYTHON" -m venv "$VENV" || die "$name: cannot make a venv with $SLUICE_EMULATORS_PYTHON"
  fi
  PIP_CACHE_DIR="$CACHE/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    quietly "$name-install.log" "$VENV/bin/pip" install "$(pip_requirement "$name")" ||
    die "$name: pip install $(pip_requirement "$name") failed (is PyPI reachable?)"
  # Both emulators share the venv: their requirements must agree.
  quietly pip-check.log "$VENV/bin/pip" check || die "$name: the venv's requirements conflict (pip check above)"
  venv_has "$name" || die "$name: installed, but the venv does not report version $(pip_version "$name")"
  say "$name $(pip_version "$name"): installed in $((SECONDS - started)) s (venv $VENV)"
}

# ----------------------------------------------------------------- Mailpit --

mailpit_installed_version() {
  local bin="$SLUICE_EMULATORS_BIN/mailpit"
  [[ -x "$bin" ]] || return 1
  # The module version recorded in the binary's build information.
  go version -m "$bin" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/axllent/mailpit" {print $3}'
}

install_mailpit() {
  local started=$SECONDS version="$SLUICE_MAILPIT_VERSION"
  command -v go >/dev/null || die "go not found (Go 1.26+ is needed to build mailpit $version)"
  if [[ "$(mailpit_installed_version || true)" == "$version" ]]; then
    say "mailpit $version: already installed ($SLUICE_EMULATORS_BIN/mailpit)"
    return 0
  fi
  mkdir -p "$SLUICE_EMULATORS_BIN" "$SLUICE_EMULATORS_GOPATH"
  # As mailpit's own release build: static, stripped, its version stamped in (what `mailpit
  # version` and GET /api/v1/info report). -modcacherw lets `rm -rf` clear the module cache.
  GOPATH="$SLUICE_EMULATORS_GOPATH" GOBIN="$SLUICE_EMULATORS_BIN" \
    GOMODCACHE="$SLUICE_EMULATORS_GOPATH/pkg/mod" GOCACHE="$SLUICE_EMULATORS_GOPATH/cache" \
    GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0 \
    quietly mailpit-install.log go install -ldflags "-s -w -X github.com/axllent/mailpit/config.Version=$version" \
    "github.com/axllent/mailpit@$version" ||
    die "mailpit: go install github.com/axllent/mailpit@$version failed (Go module proxy reachable? go 1.26+?)"
  [[ "$(mailpit_installed_version || true)" == "$version" ]] ||
    die "mailpit: installed, but $SLUICE_EMULATORS_BIN/mailpit does not report $version"
  say "mailpit $version: installed in $((SECONDS - started)) s ($SLUICE_EMULATORS_BIN/mailpit)"
}

# ------------------------------------------------------------- json-server --

json_server_installed_version() {
  local pkg="$SLUICE_EMULATORS_NODE/node_modules/json-server/package.json"
  [[ -f "$pkg" && -x "$SLUICE_EMULATORS_NODE/node_modules/.bin/json-server" ]] || return 1
  node -p 'require(process.argv[1]).version' "$pkg" 2>/dev/null
}

install_json_server() {
  local started=$SECONDS version="$SLUICE_JSON_SERVER_VERSION"
  command -v node >/dev/null || die "node not found (needed for json-server $version)"
  command -v npm >/dev/null || die "npm not found (needed to install json-server $version)"
  if [[ "$(json_server_installed_version || true)" == "$version" ]]; then
    say "json-server $version: already installed ($SLUICE_EMULATORS_NODE/node_modules)"
    return 0
  fi
  mkdir -p "$SLUICE_EMULATORS_NODE"
  quietly json-server-install.log npm install --prefix "$SLUICE_EMULATORS_NODE" --cache "$CACHE/npm-cache" \
    --no-audit --no-fund --loglevel=error --save-exact "json-server@$version" ||
    die "json-server: npm install json-server@$version failed (is the npm registry reachable?)"
  [[ "$(json_server_installed_version || true)" == "$version" ]] ||
    die "json-server: installed, but the prefix does not hold version $version"
  say "json-server $version: installed in $((SECONDS - started)) s ($SLUICE_EMULATORS_NODE/node_modules)"
}

# -------------------------------------------------------------------- main --

mkdir -p "$CACHE"
# One installer at a time per cache (two start.sh may race).
exec {LOCK_FD}>"$CACHE/.install.lock"
flock "$LOCK_FD"

for name in "${EMULATORS[@]}"; do
  case "$name" in
    localstripe | moto) install_python "$name" ;;
    mailpit) install_mailpit ;;
    json-server) install_json_server ;;
  esac
done

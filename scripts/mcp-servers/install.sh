#!/usr/bin/env bash
# install.sh — installs the third-party MCP servers the gateway tests (tests/mcp-gateway) and the
# example (examples/mcp-git) run against, pinned, from the package registries with their ordinary
# clients, into $SLUICE_MCP_SERVERS (default ~/.cache/sluice/mcp-servers):
#   mcp-server-git 2026.10.19                        PyPI, into the venv venv-git
#   mcp-proxy 0.13.0                                 PyPI, into the venv venv-proxy (its own venv:
#                                                    it pins an older `mcp` than mcp-server-git)
#   @modelcontextprotocol/server-memory 2026.8.31    npm, `npm ci` of scripts/mcp-servers'
#   @modelcontextprotocol/server-filesystem 2026.8.31  package-lock.json into node/
# mcp-proxy is the stdio↔streamable-HTTP bridge that serves a stdio server over HTTP (none of the
# three servers has an HTTP mode of its own). Idempotent and quick: a part whose installed
# version matches is left alone. Prints, as its last line, the directory of the programs
# (`mcp-server-git`, `mcp-server-memory`, `mcp-server-filesystem`, `mcp-proxy`) to put on PATH.
# Needs: python3 (3.10+) with venv, node (20+) and npm.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SLUICE_MCP_SERVERS:-$HOME/.cache/sluice/mcp-servers}"
PYTHON="${SLUICE_MCP_SERVERS_PYTHON:-python3}"
GIT_VERSION=2026.10.19
PROXY_VERSION=0.13.0
LOGS="$CACHE/logs"
BIN="$CACHE/bin"

say() { printf '[mcp-servers] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# quietly LOG CMD... — runs CMD with its output in $LOGS/LOG; on failure prints the log's tail.
quietly() {
  local log="$LOGS/$1" status=0
  shift
  "$@" >"$log" 2>&1 || status=$?
  if ((status != 0)); then
    say "---- last 30 lines of $log ----"
    tail -n 30 "$log" >&2
  fi
  return "$status"
}

# venv_package VENV DIST VERSION — installs DIST==VERSION into the venv VENV unless it is there.
venv_package() {
  local venv="$CACHE/$1" dist="$2" version="$3" started=$SECONDS
  local probe='import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])'
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$probe" "$dist" "$version" 2>/dev/null; then
    say "$dist $version: already installed ($venv)"
    return 0
  fi
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found (Python 3.10+ is needed for $dist)"
  [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv" || die "$dist: cannot make a venv at $venv"
  PIP_CACHE_DIR="$CACHE/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    quietly "$dist-install.log" "$venv/bin/pip" install "$dist==$version" ||
    die "$dist: pip install $dist==$version failed (is PyPI reachable?)"
  "$venv/bin/python" -c "$probe" "$dist" "$version" || die "$dist: installed, but $venv does not report $version"
  say "$dist $version: installed in $((SECONDS - started)) s ($venv)"
}

# The npm servers: the committed package.json and package-lock.json, `npm ci` when they changed.
node_servers() {
  local node="$CACHE/node" started=$SECONDS
  command -v node >/dev/null || die "node not found (needed for the memory and filesystem servers)"
  command -v npm >/dev/null || die "npm not found (needed to install the memory and filesystem servers)"
  if [[ -x "$node/node_modules/.bin/mcp-server-memory" && -x "$node/node_modules/.bin/mcp-server-filesystem" ]] &&
    cmp -s "$HERE/package-lock.json" "$node/package-lock.json" && cmp -s "$HERE/package.json" "$node/package.json"; then
    say "server-memory, server-filesystem: already installed ($node)"
    return 0
  fi
  mkdir -p "$node"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$node/"
  (cd "$node" && quietly npm-install.log npm ci --cache "$CACHE/npm-cache" --no-audit --no-fund --loglevel=error) ||
    die "npm ci of scripts/mcp-servers/package-lock.json failed (is the npm registry reachable?)"
  say "server-memory, server-filesystem: installed in $((SECONDS - started)) s ($node)"
}

mkdir -p "$CACHE" "$LOGS" "$BIN"
# One installer at a time per cache (suites and the example may start it together).
exec {LOCK_FD}>"$CACHE/.install.lock"
flock "$LOCK_FD"

venv_package venv-git mcp-server-git "$GIT_VERSION"
venv_package venv-proxy mcp-proxy "$PROXY_VERSION"
node_servers
ln -sfn "$CACHE/venv-git/bin/mcp-server-git" "$BIN/mcp-server-git"
ln -sfn "$CACHE/venv-proxy/bin/mcp-proxy" "$BIN/mcp-proxy"
ln -sfn "$CACHE/node/node_modules/.bin/mcp-server-memory" "$BIN/mcp-server-memory"
ln -sfn "$CACHE/node/node_modules/.bin/mcp-server-filesystem" "$BIN/mcp-server-filesystem"
echo "$BIN"

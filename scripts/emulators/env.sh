# shellcheck shell=bash
# env.sh — source this (". scripts/emulators/env.sh") to get the versions, cache paths and
# run directory of the API emulators that install.sh installs and start.sh runs: localstripe
# (a fake Stripe), Mailpit (email with an HTTP API), json-server (REST over a JSON file) and
# moto in server mode (AWS). The examples' tests run against them (issue 28).
#
# Every value can be overridden by setting it before sourcing. Nothing here touches the disk
# or the network. Safe to source under `set -euo pipefail`.

# Everything install.sh fetches lives here, outside the clone: the Python venv, the Go
# module and build caches with the mailpit binary, the npm prefix, and each client's download
# cache. To reinstall from nothing, remove the directory.
export SLUICE_EMULATORS_CACHE="${SLUICE_EMULATORS_CACHE:-$HOME/.cache/sluice/emulators}"
# Runtime state: one directory per emulator (config, data, log), wiped on each fresh start,
# with the pid files beside them.
export SLUICE_EMULATORS_RUN="${SLUICE_EMULATORS_RUN:-$SLUICE_EMULATORS_CACHE/run}"

# Versions, from PyPI, the Go module proxy and the npm registry.
export SLUICE_LOCALSTRIPE_VERSION="${SLUICE_LOCALSTRIPE_VERSION:-1.15.10}"
export SLUICE_MOTO_VERSION="${SLUICE_MOTO_VERSION:-5.2.5}"
export SLUICE_MAILPIT_VERSION="${SLUICE_MAILPIT_VERSION:-v1.33.1}"
export SLUICE_JSON_SERVER_VERSION="${SLUICE_JSON_SERVER_VERSION:-0.17.4}"

# localstripe and moto share one venv (their requirements do not conflict: install.sh runs
# `pip check` after every change). It is made by this Python (3.9 or later).
export SLUICE_EMULATORS_PYTHON="${SLUICE_EMULATORS_PYTHON:-python3}"
export SLUICE_EMULATORS_VENV="${SLUICE_EMULATORS_VENV:-$SLUICE_EMULATORS_CACHE/venv}"
# `go install` puts mailpit here (GOBIN); GOPATH, GOMODCACHE and GOCACHE sit under it.
export SLUICE_EMULATORS_GOPATH="${SLUICE_EMULATORS_GOPATH:-$SLUICE_EMULATORS_CACHE/go}"
export SLUICE_EMULATORS_BIN="${SLUICE_EMULATORS_BIN:-$SLUICE_EMULATORS_CACHE/bin}"
# `npm install --prefix` puts json-server under node_modules/ here.
export SLUICE_EMULATORS_NODE="${SLUICE_EMULATORS_NODE:-$SLUICE_EMULATORS_CACHE/node}"

# Mailpit's web UI and API take HTTP basic auth: start.sh writes an htpasswd file for this
# user, with this password or, when it is empty, a random one generated at each fresh start.
# start.sh prints both. Test-only credentials: nothing here protects anything.
export SLUICE_EMU_MAILPIT_USER="${SLUICE_EMU_MAILPIT_USER:-sluice}"
export SLUICE_EMU_MAILPIT_PASSWORD="${SLUICE_EMU_MAILPIT_PASSWORD:-}"

# How long start.sh waits for each emulator to answer.
export SLUICE_EMULATORS_START_TIMEOUT="${SLUICE_EMULATORS_START_TIMEOUT:-60}"

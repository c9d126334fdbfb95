#!/usr/bin/env bash
# deny.sh — `cargo deny` over the workspace's dependency graph, with deny.toml: licences (an
# allow-list), bans (crates Sluice must not link, duplicate versions), sources (crates.io
# only). cargo-deny is installed from crates.io into ~/.cache/sluice/tools by
# scripts/tools/install.sh (once per machine).
#
# The advisories check needs the RustSec advisory database, a git repository on GitHub, which
# CI here cannot reach: it runs only with SLUICE_DENY_ADVISORIES=1, on a machine that can fetch
# it (docs/release.md, before every release).
#
# Ends with one line "N passed, N failed, N skipped": one per check run (advisories counted as
# skipped when off).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
deny="$(scripts/tools/install.sh cargo-deny | tail -n 1)" || {
  echo "deny.sh: cargo-deny could not be installed"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}
checks=(licenses bans sources)
skipped=1
if [ "${SLUICE_DENY_ADVISORIES:-0}" = 1 ]; then
  checks+=(advisories)
  skipped=0
else
  echo "advisories: skipped (the RustSec database is on GitHub; SLUICE_DENY_ADVISORIES=1 runs it)"
fi
passed=0 failed=0
for check in "${checks[@]}"; do
  if "$deny" --locked --color never check --hide-inclusion-graph "$check"; then
    passed=$((passed + 1))
  else
    echo "cargo deny check $check: FAILED"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# The release artifacts, made and checked as scripts/release.sh makes them, on the debug build
# scripts/test.sh has just made (--profile dev: the same cargo invocation, so nothing is
# compiled; a release build would add 10-17 minutes on two cores) and with the SDK files
# scripts/test.sh built before the suites (--keep-sdks; built here when they are missing).
# Then `cargo deny` (scripts/deny.sh): licences, bans, duplicate versions, sources.
# Ends with one line "N passed, N failed, N skipped": the release's checks and cargo deny's.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
log="$(mktemp -t sluice-release.XXXXXX)"
trap 'rm -f "$log"' EXIT

began=$SECONDS
scripts/release.sh --profile dev --keep-sdks --dist "${SLUICE_DIST:-$root/dist}" 2>&1 | tee "$log"
release_status=${PIPESTATUS[0]}
echo "release.sh --profile dev: $((SECONDS - began)) s (exit $release_status)"
line="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)"
if [ -z "$line" ]; then
  line="0 passed, 1 failed, 0 skipped"
elif [ "$release_status" != 0 ] && [ "$(echo "$line" | awk '{print $3}')" = 0 ]; then
  line="$(echo "$line" | awk '{printf "%d passed, 1 failed, %d skipped", $1, $5}')"
fi

began=$SECONDS
scripts/deny.sh 2>&1 | tee "$log"
deny_status=${PIPESTATUS[0]}
echo "cargo deny: $((SECONDS - began)) s (exit $deny_status)"
deny_line="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)"
[ -n "$deny_line" ] || deny_line="0 passed, 1 failed, 0 skipped"

echo "$line" "$deny_line" | awk '{ printf "%d passed, %d failed, %d skipped\n", $1 + $7, $3 + $9, $5 + $11 }'
[ "$release_status" = 0 ] && [ "$deny_status" = 0 ]

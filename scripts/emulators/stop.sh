#!/usr/bin/env bash
# stop.sh [localstripe|mailpit|json-server|moto|all ...] — stops the emulators that start.sh
# started (default all): SIGTERM, up to 10 s, then SIGKILL; removes the pid files. Only ever
# signals a process carrying this cache's marker (SLUICE_EMULATOR=<its run dir> in its
# environment), found by the pid file or, when that is stale, by the marker. Not running is
# not an error. Logs and data are left in the run dir for inspection; start.sh wipes them.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
parse_emulators "$@" || { usage; exit 0; }

for name in "${EMULATORS[@]}"; do
  stop_emulator "$name"
done

#!/usr/bin/env bash
# stop.sh [kafka|cassandra|all] — stops the test engines that start.sh started
# (default all): SIGTERM, wait (Kafka up to 30 s, Cassandra up to 60 s), then
# SIGKILL; removes the pid files. Only ever signals the process whose command
# line carries this checkout's engine config path (from the pid file, or found
# by that path if the pid file is gone). Not running is not an error.
# Runtime data and logs are left in place for inspection; start.sh wipes them.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$HERE/env.sh"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
parse_engines "$@" || { usage; exit 0; }

for engine in "${ENGINES[@]}"; do
  stop_engine "$engine"
done

#!/usr/bin/env bash
# Where an engine's CPU goes, by thread pool: a snapshot of every thread's user + system time
# (from /proc/<pid>/task/*/stat), and the difference of two snapshots grouped by thread name
# with its trailing number dropped ("MutationStage-3" and "MutationStage-7" are one pool).
#
#   scripts/engines/threads-cpu.sh snapshot cassandra|kafka|PID > before.tsv
#   ... run the work ...
#   scripts/engines/threads-cpu.sh snapshot cassandra > after.tsv
#   scripts/engines/threads-cpu.sh diff before.tsv after.tsv [EFFECTS]
#
# `diff` prints milliseconds of CPU per pool, largest first, and per effect when EFFECTS is
# given. A thread that ended between the snapshots is missing from the second and not counted
# (pools keep their threads; a short-lived one is a rounding error). docs/scaling.md quotes it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$here/env.sh"
# shellcheck source=lib.sh
. "$here/lib.sh"

usage() {
  echo "usage: $0 snapshot cassandra|kafka|PID  |  $0 diff BEFORE AFTER [EFFECTS]" >&2
  exit 2
}

snapshot() {
  local target="$1" pid
  if [[ "$target" =~ ^[0-9]+$ ]]; then
    pid="$target"
  elif [ "$target" != cassandra ] && [ "$target" != kafka ]; then
    usage
  else
    pid="$(engine_pid "$target")" || { echo "$target is not running" >&2; exit 1; }
  fi
  [ -d "/proc/$pid/task" ] || { echo "no process $pid" >&2; exit 1; }
  local ticks
  ticks="$(getconf CLK_TCK)"
  # tid, pool name, CPU ms. The name sits in parentheses and may hold spaces ("GC Thread#0"),
  # so the fields after it are counted from the closing parenthesis.
  for stat in /proc/"$pid"/task/*/stat; do
    line="$(cat "$stat" 2>/dev/null)" || continue
    tid="${line%% *}"
    name="${line#*(}"; name="${name%)*}"
    rest="${line##*) }"
    read -r -a f <<<"$rest"
    # rest starts at field 3 (state): utime is field 14, stime 15.
    ms=$(( (f[11] + f[12]) * 1000 / ticks ))
    pool="$(sed -E 's/[-#:_ ]?[0-9]*:?$//' <<<"$name")"
    printf '%s\t%s\t%s\n' "$tid" "$pool" "$ms"
  done
}

diff_snapshots() {
  local before="$1" after="$2" effects="${3:-}"
  awk -F'\t' -v effects="$effects" '
    NR == FNR { was[$1] = $3; next }
    { d = $3 - (($1 in was) ? was[$1] : 0); used[$2] += d; total += d }
    END {
      for (p in used) if (used[p] > 0) printf "%s\t%d\n", p, used[p] | "sort -t\"\t\" -k2,2nr"
      close("sort -t\"\t\" -k2,2nr")
      printf "total\t%d ms", total
      if (effects > 0) printf "\t%.3f ms per effect (%d effects)", total / effects, effects
      printf "\n"
    }' "$before" "$after"
}

case "${1:-}" in
  snapshot) [ $# -eq 2 ] || usage; snapshot "$2" ;;
  diff) [ $# -ge 3 ] || usage; diff_snapshots "$2" "$3" "${4:-}" ;;
  *) usage ;;
esac

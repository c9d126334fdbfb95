#!/usr/bin/env bash
# The shape check (docs/architecture.md, "The shape check"): the services' source holds no
# match on a command's status, no time arithmetic about a command and no publish of its own,
# beyond what scripts/job-shape-allow.txt still lists. The check's rules are in the header of
# scripts/check-job-shape.py. Runs the check's self-test first (a tree that breaks each rule
# must fail, presentation must pass, a stale allow-list entry must fail), then the check.
#
#   scripts/check-job-shape.sh            # exits non-zero naming file:line and the rule
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check-job-shape.py --self-test
python3 scripts/check-job-shape.py "$@"

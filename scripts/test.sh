#!/usr/bin/env bash
# Runs Sluice's whole test suite: formatting, lints, and every test of the workspace.
# The build is cached outside the clone (CARGO_TARGET_DIR, default ~/.cache/sluice/target).
# Ends with one summary line: "N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
log="$(mktemp -t sluice-test.XXXXXX)"
trap 'rm -f "$log"' EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
set +e
cargo test --workspace --locked 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# Sum the per-binary "test result:" lines into one closing line.
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/)  passed  += $i
            if ($(i+1) ~ /^failed/)  failed  += $i
            if ($(i+1) ~ /^ignored/) ignored += $i
        }
     }
     END { printf "%d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
exit "$status"

#!/usr/bin/env bash
# The TypeScript SDK (sdk/typescript, @sluice/client): installs its pinned dependencies with
# `npm ci` from the committed package-lock.json (npm's cache in ~/.cache/sluice/npm), type-checks
# and builds it with tsc, checks that the types generated from schemas/openapi.yaml are current,
# then installs the npm tarball scripts/release.sh packs (scripts/test.sh makes it once before
# the suites, into $SLUICE_DIST, else this suite does) into build-test/ as a consumer project
# would, and runs the tests there with node's test runner: they import `@sluice/client` by name,
# so they run against the tarball's files (the unexported signature module's unit tests,
# test/internal/, against the source), with the agent frameworks of the adapters' tests (the
# OpenAI Agents SDK, the Vercel AI SDK) installed beside it. Against the real `sluice dev`
# ($SLUICE_BIN) and tool servers on loopback. Needs Node 20+ and npm. Ends with "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/../../sdk/typescript"

summary_fail() {
  echo "typescript-sdk: $1" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}

command -v node >/dev/null && command -v npm >/dev/null || summary_fail "node and npm are needed (Node 20 or later)"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 20 ] || summary_fail "Node 20 or later is needed, this is $(node --version)"
export SLUICE_BIN="${SLUICE_BIN:-/work/bin/sluice}"
[ -x "$SLUICE_BIN" ] || summary_fail "no sluice binary at $SLUICE_BIN (set SLUICE_BIN, e.g. to target/debug/sluice)"
export npm_config_cache="${npm_config_cache:-$HOME/.cache/sluice/npm}"
export npm_config_update_notifier=false

echo "== npm ci"
npm ci --no-audit --no-fund || summary_fail "npm ci failed"
echo "== tsc (the package into dist/, then the tests, type-checked with it)"
rm -rf dist build-test
npm run --silent build || summary_fail "tsc could not build the package"
npm run --silent build-tests || summary_fail "the tests do not type-check"
echo "== generated types are current"
npm run --silent check-generated || summary_fail "src/generated/openapi.ts is stale"
log="$(mktemp -t sluice-ts-test.XXXXXX)"
trap 'rm -f "$log"' EXIT
echo "== the npm tarball of the release, installed into build-test/ as a consumer installs it"
dist="${SLUICE_DIST:-$(cd ../.. && pwd)/dist}"
../../scripts/release.sh --sdks-only --keep-sdks --dist "$dist" >"$log" 2>&1 \
  || { cat "$log"; summary_fail "scripts/release.sh --sdks-only failed"; }
tarballs=("$dist"/sluice-client-*.tgz)
[ -f "${tarballs[0]}" ] || summary_fail "no npm tarball in $dist"
# The agent frameworks the adapters' tests drive (@sluice/client/openai-agents, /ai-sdk) are
# the package's optional peers: a consumer installs them beside it, at the versions pinned in
# the package's devDependencies.
peers="$(node -p 'const d = require("./package.json").devDependencies; ["@openai/agents", "ai", "zod"].map((n) => `"${n}": "${d[n]}"`).join(", ")')"
cat >build-test/package.json <<EOF
{
  "name": "sluice-client-tests",
  "private": true,
  "type": "module",
  "dependencies": { "@sluice/client": "file:${tarballs[0]}", ${peers} }
}
EOF
(cd build-test && npm install --no-audit --no-fund --no-package-lock --silent) \
  || summary_fail "npm install ${tarballs[0]##*/} failed"
resolved="$(cd build-test/test && node --input-type=module -e 'console.log(import.meta.resolve("@sluice/client"))')"
case "$resolved" in
  */sdk/typescript/build-test/node_modules/@sluice/client/dist/index.js) echo "the tests import $resolved" ;;
  *) summary_fail "the tests would import @sluice/client from $resolved, not from the installed tarball" ;;
esac
export SLUICE_SDK_FROM_TARBALL=1
echo "== node --test"
node --test --test-reporter=spec build-test/test/*.test.js build-test/test/internal/*.test.js 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# The spec reporter's totals: "ℹ pass N", "ℹ fail N", "ℹ cancelled N", "ℹ skipped N", "ℹ todo N".
total() { awk -v name="$1" '$2 == name { n = $3 } END { print n + 0 }' "$log"; }
passed="$(total pass)"
failed=$(( $(total fail) + $(total cancelled) ))
skipped=$(( $(total skipped) + $(total todo) ))
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "node --test exited $status with no failed test"
  failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

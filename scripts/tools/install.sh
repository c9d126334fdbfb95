#!/usr/bin/env bash
# install.sh TOOL — installs one of the release tools from crates.io into the cache,
# $SLUICE_TOOLS (default ~/.cache/sluice/tools), with `cargo install --locked --root`, at the
# version pinned here, and prints the binary's path last. Idempotent: a binary of the pinned
# version already there is kept, so CI pays the build once per machine.
#
#   cargo-deny       licences, bans, duplicate versions and sources (deny.toml)
#   cargo-cyclonedx  the CycloneDX SBOM of the release (scripts/release.sh)
#
# The tool's build has a target directory of its own under the cache (not the workspace's),
# removed afterwards. Needs cargo and crates.io; a few minutes on two cores the first time.
set -euo pipefail

tool="${1:?usage: scripts/tools/install.sh cargo-deny|cargo-cyclonedx}"
case "$tool" in
  # 0.20 needs Rust 1.88; the advisories check is off in deny.toml (its database is a git
  # repository on GitHub, which CI cannot reach).
  cargo-deny) version=0.20.2 ;;
  cargo-cyclonedx) version=0.5.9 ;;
  *) echo "install.sh: unknown tool '$tool' (cargo-deny or cargo-cyclonedx)" >&2; exit 2 ;;
esac
root="${SLUICE_TOOLS:-$HOME/.cache/sluice/tools}"
bin="$root/bin/$tool"
stamp="$root/.$tool.version"

if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"
build="$(mktemp -d "$root/.build-$tool.XXXXXX")"
trap 'rm -rf "$build"' EXIT
echo "installing $tool $version from crates.io into $root (cargo install --locked)" >&2
CARGO_TARGET_DIR="$build" cargo install --quiet --locked --root "$root" --version "$version" "$tool" >&2
echo "$version" >"$stamp"
echo "$bin"

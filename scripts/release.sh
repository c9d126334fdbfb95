#!/usr/bin/env bash
# release.sh — every release artifact of Sluice from one command, checked, published nowhere:
#
#   scripts/release.sh                      # a release: release profile, into dist/
#   scripts/release.sh --profile dev        # the same packaging on the debug build (CI's check)
#   scripts/release.sh --sdks-only          # only the SDKs' files (what the SDK suites install)
#
# Options:
#   --profile release|dev  cargo profile of the binaries (default release: 10-17 min for the
#                          workspace on two cores; dev reuses the debug build scripts/test.sh made)
#   --dist DIR             where the artifacts go (default dist/, emptied first)
#   --sdks-only            build the Python wheel and sdist and the npm tarball, then stop
#   --keep-sdks            reuse the SDK files already in DIR when they were built from these
#                          very SDK sources (scripts/test.sh builds them once, before its suites)
#   --allow-dirty          a release profile build from a tree with uncommitted changes
#                          (refused otherwise; its revision is marked -dirty either way)
#
# What lands in DIR (docs/release.md), <target> being the host's (rustc -vV):
#   sluice-<version>-<target>.tar.gz       sluice, sluice-producer, sluice-dispatcher,
#                                          sluice-reconciler, sluice-compensator, LICENSE,
#                                          CHANGELOG.md, README.md
#   sluice-demo-<version>-<target>.tar.gz  the demo upstream (sluice-upstream), not a service
#   sluice-<version>-<target>.cdx.json     CycloneDX SBOM of the binaries (cargo-cyclonedx)
#   sluice_sdk-<version>-py3-none-any.whl, sluice_sdk-<version>.tar.gz   Python SDK
#   sluice-client-<version>.tgz            TypeScript SDK (npm pack)
#   SHA256SUMS                             sha256sum of each of the above
# and then checks them (scripts/release/verify.py): the checksums, each tarball's exact
# contents, `--version` of every binary from the tarball (version and commit), the shared
# libraries they need against what the distroless image has, the SBOM against the CycloneDX
# schema and its components, the SDK files' names, versions and contents. Its last line is
# "N passed, N failed, N skipped".
#
# Tools: cargo-cyclonedx from crates.io (scripts/tools/install.sh, cached in
# ~/.cache/sluice/tools); PyPI's `build` and `cyclonedx-python-lib` in a virtualenv at
# ~/.cache/sluice/venv-release; npm for the TypeScript SDK. Nothing is uploaded anywhere.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

profile=release dist="$root/dist" sdks_only=0 keep_sdks=0 allow_dirty=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs release or dev}"; shift 2 ;;
    --dist) dist="${2:?--dist needs a directory}"; shift 2 ;;
    --sdks-only) sdks_only=1; shift ;;
    --keep-sdks) keep_sdks=1; shift ;;
    --allow-dirty) allow_dirty=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "release.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) out_dir=release ;;
  dev) out_dir=debug ;;
  *) echo "release.sh: --profile must be release or dev, not '$profile'" >&2; exit 2 ;;
esac
mkdir -p "$dist"
dist="$(cd "$dist" && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
export npm_config_cache="${npm_config_cache:-$HOME/.cache/sluice/npm}"
export npm_config_update_notifier=false

# ------------------------------------------------------------------------------------------
# The version (one source of truth: the workspace's) and every copy of it agree.
version="$(python3 scripts/release/versions.py --check)" || exit 1
echo "== Sluice $version"

# The revision --version names: the build script reads git itself (shared/build-info/build.rs);
# a tree with uncommitted changes is marked -dirty here, through SLUICE_GIT_REVISION.
if [ -z "${SLUICE_GIT_REVISION:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
  revision="$(git rev-parse --short=12 HEAD)"
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    if [ "$profile" = release ] && [ "$allow_dirty" = 0 ] && [ "$sdks_only" = 0 ]; then
      echo "release.sh: the tree has uncommitted changes (git status); commit them, or pass --allow-dirty" >&2
      exit 1
    fi
    revision="$revision-dirty"
    export SLUICE_GIT_REVISION="$revision"
  fi
else
  revision="${SLUICE_GIT_REVISION:-unknown}"
fi
# Reproducible archives and SBOM: every time in them is the commit's. Not exported: the `cc`
# crate's build scripts rerun when SOURCE_DATE_EPOCH changes, so cargo would rebuild every C
# dependency and all above them (the whole workspace) instead of reusing the build.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
echo "revision $revision, profile $profile, into $dist"

# ------------------------------------------------------------------------------------------
# Tools in the cache: a virtualenv with PyPI's `build` (the wheel and sdist) and
# cyclonedx-python-lib (the SBOM's validation).
venv="${SLUICE_RELEASE_VENV:-$HOME/.cache/sluice/venv-release}"
python_tools() {
  local want="build==1.6.1 cyclonedx-python-lib[json-validation]==11.12.0"
  if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" || {
      if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      fi
      rm -rf "$venv" && python3 -m venv "$venv"
    }
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $want
    echo "$want" >"$venv/.installed"
  fi
}
python_tools

# ------------------------------------------------------------------------------------------
# The SDKs. Their sources' fingerprint (tracked files and uncommitted changes under sdk/)
# decides whether --keep-sdks may reuse what is in DIR.
# Python spells a pre-release its own way (PEP 440: 1.0.0-rc.1 is 1.0.0rc1).
pyversion="$("$venv/bin/python" -c 'import sys; from packaging.version import Version; print(Version(sys.argv[1]))' "$version")"
sdk_files=("sluice_sdk-$pyversion-py3-none-any.whl" "sluice_sdk-$pyversion.tar.gz" "sluice-client-$version.tgz")
sdk_stamp="$( (git ls-files -s sdk/python sdk/typescript schemas/openapi.yaml; git diff HEAD -- sdk schemas
  git ls-files --others --exclude-standard sdk | xargs -r sha256sum) 2>/dev/null | sha256sum | cut -c1-32)"
have_sdks() {
  [ "$(cat "$dist/.sdks-source" 2>/dev/null)" = "$sdk_stamp" ] || return 1
  for f in "${sdk_files[@]}"; do [ -s "$dist/$f" ] || return 1; done
}
build_sdks() {
  echo "== the Python SDK: wheel and sdist (python -m build)"
  local tmp
  tmp="$(mktemp -d)"
  # A copy, so the build leaves nothing in the clone.
  git ls-files -z --cached --others --exclude-standard sdk/python \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$tmp" -xf -
  "$venv/bin/python" -m build --outdir "$dist" "$tmp/sdk/python" >"$tmp/build.log" 2>&1 \
    || { cat "$tmp/build.log"; rm -rf "$tmp"; echo "release.sh: python -m build failed" >&2; exit 1; }
  tail -n 1 "$tmp/build.log"
  rm -rf "$tmp"
  echo "== the TypeScript SDK: npm ci, tsc, npm pack"
  (
    cd sdk/typescript
    npm ci --no-audit --no-fund --silent
    # `prepack` builds dist/ with tsc; --pack-destination keeps the tarball out of the clone.
    npm pack --silent --pack-destination "$dist" >/dev/null
  ) || { echo "release.sh: npm pack failed" >&2; exit 1; }
  echo "$sdk_stamp" >"$dist/.sdks-source"
}

if [ "$keep_sdks" = 1 ] && have_sdks; then
  echo "== the SDKs: reusing $dist's (built from these sources)"
  if [ "$sdks_only" = 0 ]; then
    # shellcheck disable=SC2046
    find "$dist" -mindepth 1 -maxdepth 1 ! -name .sdks-source \
      $(printf '! -name %s ' "${sdk_files[@]}") -exec rm -rf {} +
  fi
else
  find "$dist" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
  build_sdks
fi
if [ "$sdks_only" = 1 ]; then
  "$venv/bin/python" scripts/release/verify.py --dist "$dist" --version "$version" --sdks-only
  exit $?
fi

# ------------------------------------------------------------------------------------------
# The binaries: the same cargo invocation as scripts/test.sh's build (the whole workspace's
# binaries, so the features are the same and the dev profile builds nothing new in CI), only
# the profile differs.
target="$(rustc -vV | sed -n 's/^host: //p')"
echo "== cargo build --locked --workspace --bins --profile $profile ($target)"
began=$SECONDS
cargo build --locked --workspace --bins --profile "$profile"
echo "built in $((SECONDS - began)) s"
bins=(sluice sluice-producer sluice-dispatcher sluice-reconciler sluice-compensator)

pack() { # pack NAME FILE... — DIR/NAME.tar.gz holding NAME/<each file's base name>
  local name="$1" stage
  shift
  stage="$(mktemp -d)"
  mkdir "$stage/$name"
  cp -p "$@" "$stage/$name/"
  chmod 0644 "$stage/$name"/*.md "$stage/$name/LICENSE" 2>/dev/null || true
  tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    -cf - "$name" | gzip -n -6 >"$dist/$name.tar.gz"
  rm -rf "$stage"
}
echo "== packing"
began=$SECONDS
docs=(LICENSE CHANGELOG.md README.md)
pack "sluice-$version-$target" "${bins[@]/#/$CARGO_TARGET_DIR/$out_dir/}" "${docs[@]}"
pack "sluice-demo-$version-$target" "$CARGO_TARGET_DIR/$out_dir/sluice-upstream" LICENSE
echo "packed in $((SECONDS - began)) s"

# ------------------------------------------------------------------------------------------
# The SBOM: cargo-cyclonedx describes each binary of the workspace from `cargo metadata` (the
# same resolution as the build: every workspace member, this target); the five release
# binaries' documents are merged into one by scripts/release/sbom.py.
echo "== SBOM (cargo-cyclonedx)"
cyclonedx="$(scripts/tools/install.sh cargo-cyclonedx | tail -n 1)"
sbom_tmp="$(mktemp -d)"
# It writes each document beside its package's Cargo.toml: run it on a copy of the tracked
# files (as they are in the work tree), not in the clone.
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$sbom_tmp" -xf -
(cd "$sbom_tmp" && SOURCE_DATE_EPOCH="$epoch" "$cyclonedx" cyclonedx --quiet --format json --spec-version 1.5 \
  --describe binaries --target "$target")
mapfile -t boms < <(for b in "${bins[@]}"; do find "$sbom_tmp" -name "${b}_bin.cdx.json"; done)
SOURCE_DATE_EPOCH="$epoch" "$venv/bin/python" scripts/release/sbom.py --version "$version" --revision "$revision" --source-root "$sbom_tmp" \
  --out "$dist/sluice-$version-$target.cdx.json" "${boms[@]}"
rm -rf "$sbom_tmp"

# ------------------------------------------------------------------------------------------
(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name '.*' -printf '%P\n' | LC_ALL=C sort \
  | xargs sha256sum >SHA256SUMS)
echo "== $dist"
(cd "$dist" && ls -l --time-style=+ | tail -n +2 | awk '{printf "  %12s  %s\n", $5, $NF}')
echo "== checks (scripts/release/verify.py)"
"$venv/bin/python" scripts/release/verify.py --dist "$dist" --version "$version" \
  --revision "$revision" --target "$target"
status=$?
if [ "$profile" = dev ]; then
  echo "(profile dev: the packaging of a release, on unoptimised binaries; not a release)"
fi
cat <<EOF
The image, from the same commit (Docker is not used here):
  docker build -f deploy/Dockerfile --build-arg SLUICE_VERSION=$version \\
    --build-arg SLUICE_GIT_REVISION=$revision -t sluice:$version .
EOF
exit "$status"

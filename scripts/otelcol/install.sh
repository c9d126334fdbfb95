#!/usr/bin/env bash
# install.sh — builds the OpenTelemetry Collector the trace test uses from the Go module proxy
# into the cache, $SLUICE_OTELCOL_CACHE (default ~/.cache/sluice/otelcol), with a module cache
# of its own there so nothing lands in the clone or in ~/go:
#   1. the OpenTelemetry Collector Builder (ocb, go.opentelemetry.io/collector/cmd/builder)
#      at $SLUICE_OTELCOL_VERSION (default v0.161.0);
#   2. a collector of the components in builder.yaml beside this script (an OTLP receiver,
#      the debug and file exporters), at the same version.
# (The core distribution, otelcorecol, cannot be `go install`ed: its go.mod has replace
# directives, and it has no file exporter.)
# Idempotent: a binary already built from the same manifest is kept. Needs Go and the proxy on
# the first run (several minutes of build on two cores). Prints the binary's path last.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="${SLUICE_OTELCOL_VERSION:-v0.161.0}"
cache="${SLUICE_OTELCOL_CACHE:-$HOME/.cache/sluice/otelcol}"
out="$cache/$version"
bin="$out/sluice-otelcol"
manifest_sum="$(sed "s/v0\.161\.0/$version/g" "$HERE/builder.yaml" | sha256sum | cut -c1-16)"

if [ -x "$bin" ] && [ "$(cat "$out/.manifest" 2>/dev/null)" = "$manifest_sum" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "install.sh: go is not on PATH" >&2; exit 1; }
mkdir -p "$out"
export GOMODCACHE="$cache/gomod" GOFLAGS="-buildvcs=false -modcacherw" CGO_ENABLED=0
GOBIN="$out" go install "go.opentelemetry.io/collector/cmd/builder@$version" >&2
# ocb does not expand variables in its manifest: the version and output path are put in here.
sed -e "s/v0\.161\.0/$version/g" -e "s|\${SLUICE_OTELCOL_OUT}|$out/build|" \
  "$HERE/builder.yaml" >"$out/builder.yaml"
"$out/builder" --config "$out/builder.yaml" >&2
cp "$out/build/sluice-otelcol" "$bin"
rm -rf "$out/build"
echo "$manifest_sum" >"$out/.manifest"
echo "$bin"

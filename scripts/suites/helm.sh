#!/usr/bin/env bash
# The Helm chart (deploy/helm/sluice), rendered and validated without a cluster:
#
#   * the tools from the registries, cached in ~/.cache/sluice/tools (scripts/helm/install.sh):
#     helm and kubeconform built from the Go module proxy, the Kubernetes schemas from PyPI's
#     kubernetes-validate, the CRD schemas of ServiceMonitor, PrometheusRule, ScaledObject and
#     ExternalSecret from the operators' own Go modules;
#   * `helm lint --strict` and `helm template` with the default values and each value set in
#     deploy/helm/sluice/ci/ (every integration on; OAUTHBEARER with fixed replicas);
#   * kubeconform -strict of every rendering against Kubernetes 1.29 and 1.37 and the CRDs;
#   * the chart against the kustomize base (k8s/) and deploy/: the same configuration, catalog,
#     probes, security context, resources, grace periods, PDBs, Services, autoscalers, KEDA
#     settings, migration Job, alert rules and dashboard; what the chart adds (the checksum that
#     rolls the pods, the migration hook, the release's consumer groups, the NetworkPolicies)
#     does what it says; bad values are refused naming the key;
#   * with SLUICE_BIN (scripts/test.sh sets it): each rendered sluice.toml, with the pods'
#     environment, loaded by the real `sluice migrate --print`, and each catalog checked by
#     `sluice catalog check`.
# Ends with `N passed, N failed, N skipped` (scripts/suites/README.md). The first run on a machine
# builds helm (about 8 minutes on two busy cores) and kubeconform (seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! python3 -c 'import yaml' 2>/dev/null; then
  python3 -m pip install --user --quiet pyyaml
fi
began=$SECONDS
if ! tools="$(scripts/helm/install.sh 2>/tmp/sluice-helm-install.$$ | tail -n 1)" || [ -z "$tools" ]; then
  tail -n 20 /tmp/sluice-helm-install.$$
  rm -f /tmp/sluice-helm-install.$$
  echo "FAIL scripts/helm/install.sh could not provide helm, kubeconform and the schemas"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
grep -E '^(built|installing|building)' /tmp/sluice-helm-install.$$ || true
rm -f /tmp/sluice-helm-install.$$
echo "tools ready in $((SECONDS - began)) s"
eval "$tools"
export SLUICE_HELM SLUICE_KUBECONFORM SLUICE_K8S_SCHEMAS SLUICE_CRD_SCHEMAS
"$SLUICE_HELM" version --short 2>/dev/null || true
exec python3 scripts/helm/check_chart.py

#!/usr/bin/env bash
# Validates the deployment artifacts without Docker or a cluster (and without building Sluice):
#
#   scripts/check-deploy.sh              # check everything; exits non-zero naming the file
#   scripts/check-deploy.sh --regenerate # rewrite the generated files, then check
#
# Always (python3 + PyYAML, installed from PyPI with `pip install --user` when missing):
#   * every YAML and JSON file under deploy/ and k8s/ parses; every TOML file too;
#   * generated files are up to date with their sources: deploy/catalog.compose.toml and
#     k8s/configmap.yaml (scripts/sync-deploy-config.py), the Grafana dashboard
#     (scripts/gen-grafana-dashboard.py);
#   * k8s: producer, dispatcher, reconciler and compensator each have a Deployment whose
#     container has a readiness probe on /readyz and a liveness probe on /healthz, a
#     PodDisruptionBudget selecting its pods, runs non-root with a read-only root filesystem
#     and no privilege escalation, and sets terminationGracePeriodSeconds; the consumers have an
#     HPA on kafka_consumergroup_lag for their group with maxReplicas <= bus.partitions; every
#     manifest is listed in kustomization.yaml (except the example Secret and the demo
#     upstream); the Secret example is marked as an example;
#   * deploy/Dockerfile (statically: no Docker here): the default target is on a distroless or
#     scratch base, runs as a numeric non-root user, copies in no demo upstream, catalog or
#     configuration, has the OCI labels (version, revision, source, licenses); the demo upstream
#     is the `demo` target, which compose's `upstream` builds;
#   * compose: the file names all services (kafka, scylla, migrate, producer, dispatcher,
#     reconciler, compensator, upstream, kafka-exporter, prometheus, grafana); the Sluice
#     services wait for migrate to complete; ScyllaDB gets tablets disabled;
#   * Prometheus: every Sluice service is scraped; the alert rules cover the required cases;
#     Grafana provisioning points at the dashboard folder and the Prometheus service;
#   * SLUICE_ overrides and TOML keys name configuration keys that exist in
#     shared/config/src/*.rs or shared/ledger-cql/src/config.rs (a warning, not a failure:
#     a key may be added by a change not merged yet).
# When the tools are installed (they are optional; nothing is downloaded for them):
#   * promtool: `check config`, `check rules`, `test rules` (deploy/prometheus/alerts.test.yml),
#     and every dashboard query parses as PromQL;
#   * yamllint: no duplicate keys (PyYAML keeps the last one silently);
#   * kubectl: `kubectl kustomize k8s/` renders, and so do its KEDA and static-membership
#     components;
#   * kubernetes-validate (PyPI): strict schema validation of the rendered manifests;
#   * compose-check (scripts/compose-check, built with Go when Go is installed; compose-go is
#     the loader of `docker compose` v2), else docker-compose v1 (Debian): the compose file loads.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == --regenerate ]]; then
  python3 scripts/sync-deploy-config.py
  python3 scripts/gen-grafana-dashboard.py
fi

if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "PyYAML is missing: installing it from PyPI (pip install --user pyyaml)"
  python3 -m pip install --user --quiet pyyaml
fi

exec python3 - "$@" <<'PYEOF'
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

failures = []
warnings = []
passed = 0


def fail(path, message):
    failures.append(f"{path}: {message}")


def warn(path, message):
    warnings.append(f"{path}: {message}")


def ok(message):
    global passed
    passed += 1
    print(f"ok   {message}")


# ------------------------------------------------------------------------------------------
# Parse every file.
docs_by_file = {}
for path in sorted(glob.glob("deploy/**/*", recursive=True) + glob.glob("k8s/**/*", recursive=True)):
    if not os.path.isfile(path):
        continue
    # The Helm chart's templates are Go templates, not YAML: scripts/suites/helm.sh renders them.
    if path.startswith("deploy/helm/") and "/templates/" in path:
        continue
    try:
        if path.endswith((".yaml", ".yml")):
            with open(path) as f:
                docs_by_file[path] = [d for d in yaml.safe_load_all(f) if d is not None]
        elif path.endswith(".json"):
            with open(path) as f:
                docs_by_file[path] = [json.load(f)]
        elif path.endswith(".toml"):
            with open(path, "rb") as f:
                tomllib.load(f)
        else:
            continue
    except Exception as e:  # noqa: BLE001 - any parse error is reported with its file
        fail(path, f"does not parse: {e}")
        continue
    ok(f"{path} parses")

# TOML embedded in the ConfigMap.
cm_path = "k8s/configmap.yaml"
configmap = next(iter(docs_by_file.get(cm_path, [])), None)
if configmap:
    for key in ("sluice.toml", "catalog.toml"):
        try:
            tomllib.loads(configmap["data"][key])
            ok(f"{cm_path} data.{key} parses as TOML")
        except Exception as e:  # noqa: BLE001
            fail(cm_path, f"data.{key}: {e}")

# ------------------------------------------------------------------------------------------
# Generated files.
for cmd, what in (
    (["python3", "scripts/sync-deploy-config.py", "--check"], "catalog copies and ConfigMap"),
    (["python3", "scripts/gen-grafana-dashboard.py", "--check"], "Grafana dashboard"),
):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        for line in (r.stderr or r.stdout).strip().splitlines():
            path, _, msg = line.partition(": ")
            fail(path or cmd[1], msg or line)
    else:
        ok(f"{what}: up to date with the sources they are generated from")

# ------------------------------------------------------------------------------------------
# Kubernetes.
SERVICES = ["producer", "dispatcher", "reconciler", "compensator"]
# The consumers' groups as the services name them (shared/bus, default_group_prefix): the
# configuration's bus.kafka.group_prefix, else its topic prefix with a trailing '.', '_' or '-'
# turned into '-'. The lag HPAs and the KEDA component name the groups literally (kustomize
# cannot derive them), so an edited prefix must be carried into them: checked below.
def group_prefix(config):
    bus = config.get("bus", {})
    if bus.get("kafka", {}).get("group_prefix"):
        return bus["kafka"]["group_prefix"]
    stem = re.sub(r"[._-]$", "", bus.get("topic_prefix", "sluice."))
    return f"{stem}-" if stem else "sluice-"


try:
    GROUPS = group_prefix(tomllib.loads(configmap["data"]["sluice.toml"])) if configmap else "sluice-"
except Exception:  # noqa: BLE001 - reported above
    GROUPS = "sluice-"
CONSUMERS = {c: f"{GROUPS}{c}" for c in ("dispatcher", "reconciler", "compensator")}

k8s = []  # (file, doc)
for path, docs in docs_by_file.items():
    if path.startswith("k8s/"):
        k8s += [(path, d) for d in docs if isinstance(d, dict) and "kind" in d]


def find(kind, name):
    return [(p, d) for p, d in k8s if d["kind"] == kind and d.get("metadata", {}).get("name") == name]


partitions = None
if configmap:
    try:
        partitions = tomllib.loads(configmap["data"]["sluice.toml"])["bus"]["partitions"]
    except Exception:  # noqa: BLE001 - reported above
        pass

for svc in SERVICES:
    name = f"sluice-{svc}"
    deps = find("Deployment", name)
    if not deps:
        fail("k8s/", f"no Deployment {name}")
        continue
    path, dep = deps[0]
    spec = dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"].get("labels", {})
    containers = spec.get("containers", [])
    c = containers[0] if containers else {}
    probes = {k: c.get(k, {}).get("httpGet", {}).get("path") for k in ("readinessProbe", "livenessProbe")}
    if probes["readinessProbe"] != "/readyz":
        fail(path, f"{name}: readinessProbe must GET /readyz (has {probes['readinessProbe']})")
    if probes["livenessProbe"] != "/healthz":
        fail(path, f"{name}: livenessProbe must GET /healthz (has {probes['livenessProbe']})")
    if probes == {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}:
        ok(f"{path}: Deployment {name} probes /readyz (readiness) and /healthz (liveness)")
    # A probe's port must be one the container declares.
    ports = {p.get("name") for p in c.get("ports", [])} | {p.get("containerPort") for p in c.get("ports", [])}
    for k in ("readinessProbe", "livenessProbe", "startupProbe"):
        port = c.get(k, {}).get("httpGet", {}).get("port")
        if port is not None and port not in ports:
            fail(path, f"{name}: {k} uses port {port!r}, which the container does not declare")
    sc = c.get("securityContext", {})
    psc = spec.get("securityContext", {})
    problems = []
    if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        problems.append("runAsNonRoot")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append("readOnlyRootFilesystem")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation: false")
    if "terminationGracePeriodSeconds" not in spec:
        problems.append("terminationGracePeriodSeconds")
    if problems:
        fail(path, f"{name}: missing {', '.join(problems)}")
    else:
        ok(f"{path}: Deployment {name} non-root, read-only root fs, no privilege escalation, "
           f"grace {spec['terminationGracePeriodSeconds']}s")
    if not any(e.get("name", "").startswith("SLUICE_") for e in c.get("env", [])):
        fail(path, f"{name}: sets no SLUICE_ environment override")
    anns = dep["spec"]["template"]["metadata"].get("annotations", {})
    if anns.get("prometheus.io/scrape") != "true":
        fail(path, f"{name}: no prometheus.io/scrape annotation")

    pdbs = [(p, d) for p, d in k8s if d["kind"] == "PodDisruptionBudget"
            and all(pod_labels.get(k) == v for k, v in d["spec"]["selector"].get("matchLabels", {}).items())]
    if pdbs:
        ok(f"{pdbs[0][0]}: PodDisruptionBudget {pdbs[0][1]['metadata']['name']} covers {name}")
    else:
        fail("k8s/", f"no PodDisruptionBudget selects the pods of {name}")

    svcs = [(p, d) for p, d in k8s if d["kind"] == "Service"
            and d["spec"].get("selector") and all(pod_labels.get(k) == v for k, v in d["spec"]["selector"].items())]
    if not svcs:
        fail("k8s/", f"no Service selects the pods of {name}")

    if svc in CONSUMERS:
        hpas = find("HorizontalPodAutoscaler", name)
        if not hpas:
            fail("k8s/", f"no HorizontalPodAutoscaler {name}")
            continue
        hpath, hpa = hpas[0]
        group = CONSUMERS[svc]
        lag = [m for m in hpa["spec"].get("metrics", []) if m.get("type") == "External"
               and m["external"]["metric"]["name"] == "kafka_consumergroup_lag"
               and m["external"]["metric"].get("selector", {}).get("matchLabels", {}).get("consumergroup") == group]
        if not lag:
            fail(hpath, f"{name}: HPA has no External kafka_consumergroup_lag metric for consumergroup={group}")
        elif hpa["spec"]["scaleTargetRef"]["name"] != name:
            fail(hpath, f"{name}: HPA targets {hpa['spec']['scaleTargetRef']['name']}")
        elif partitions is not None and hpa["spec"]["maxReplicas"] > partitions:
            fail(hpath, f"{name}: maxReplicas {hpa['spec']['maxReplicas']} > bus.partitions {partitions}")
        else:
            ok(f"{hpath}: HPA {name} on lag of {group}, maxReplicas {hpa['spec']['maxReplicas']} <= partitions {partitions}")

# The producer answers only to the names in producer.allowed_hosts besides localhost and IP
# addresses (421 otherwise): its Deployment must list the names its Service is reached by,
# qualified by the namespace the pod reads from the downward API.
for path, dep in find("Deployment", "sluice-producer"):
    c = (dep["spec"]["template"]["spec"].get("containers") or [{}])[0]
    env = c.get("env", [])
    names = [e.get("name") for e in env]
    namespace = next((e for e in env if e.get("name") == "POD_NAMESPACE"), {})
    hosts = next((e.get("value", "") for e in env if e.get("name") == "SLUICE_PRODUCER__ALLOWED_HOSTS"), None)
    service = [d["metadata"]["name"] for _, d in find("Service", "sluice-producer")]
    if hosts is None:
        fail(path, "sluice-producer: no SLUICE_PRODUCER__ALLOWED_HOSTS: requests to its Service's name would get 421")
        continue
    if namespace.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace" \
            or names.index("POD_NAMESPACE") > names.index("SLUICE_PRODUCER__ALLOWED_HOSTS"):
        fail(path, "sluice-producer: POD_NAMESPACE must come from metadata.namespace, before SLUICE_PRODUCER__ALLOWED_HOSTS uses it")
        continue
    try:
        listed = tomllib.loads("v = " + hosts.replace("$(POD_NAMESPACE)", "ns"))["v"]
    except Exception as e:  # noqa: BLE001 - reported
        fail(path, f"sluice-producer: SLUICE_PRODUCER__ALLOWED_HOSTS is not a TOML array: {e}")
        continue
    want = [f"{s}{q}" for s in service for q in ("", ".ns", ".ns.svc", ".ns.svc.cluster.local")]
    missing = [w for w in want if w not in listed]
    if missing or not service:
        fail(path, f"sluice-producer: SLUICE_PRODUCER__ALLOWED_HOSTS lacks the Service's names {missing or want}")
    else:
        ok(f"{path}: sluice-producer answers to its Service's names ({', '.join(want)})")

# The KEDA option (k8s/keda, a kustomize Component): a ScaledObject per consumer on the same
# lag, bounds and target as its HPA, and patches that delete those HPAs; and the
# prometheus-adapter rule the HPAs need, shipped in k8s/autoscaling/.
keda_component = next(iter(docs_by_file.get("k8s/keda/kustomization.yaml", [])), None)
if not keda_component:
    fail("k8s/keda/kustomization.yaml", "missing: the KEDA option")
else:
    deleted = {yaml.safe_load(p["patch"])["metadata"]["name"] for p in keda_component.get("patches", [])
               if "$patch: delete" in p.get("patch", "")}
    for svc, group in CONSUMERS.items():
        name = f"sluice-{svc}"
        sos = find("ScaledObject", name)
        hpas = find("HorizontalPodAutoscaler", name)
        if not sos or not hpas:
            fail("k8s/keda/scaledobjects.yaml", f"no ScaledObject {name}")
            continue
        (spath, so), (_, hpa) = sos[0], hpas[0]
        spec = so["spec"]
        trig = [t for t in spec.get("triggers", []) if t.get("type") == "prometheus"
                and f'consumergroup="{group}"' in t["metadata"].get("query", "")
                and "kafka_consumergroup_lag" in t["metadata"].get("query", "")]
        hpa_target = next((m["external"]["target"]["averageValue"] for m in hpa["spec"]["metrics"]
                           if m.get("type") == "External"), None)
        if spec["scaleTargetRef"]["name"] != name:
            fail(spath, f"{name}: targets {spec['scaleTargetRef']['name']}")
        elif not trig:
            fail(spath, f"{name}: no prometheus trigger on kafka_consumergroup_lag of {group}")
        elif (spec.get("minReplicaCount"), spec.get("maxReplicaCount")) != (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]):
            fail(spath, f"{name}: replica bounds differ from its HPA's")
        elif str(trig[0]["metadata"].get("threshold")) != str(hpa_target):
            fail(spath, f"{name}: threshold {trig[0]['metadata'].get('threshold')} differs from the HPA's {hpa_target}")
        elif name not in deleted:
            fail("k8s/keda/kustomization.yaml", f"does not delete the HPA {name} (two autoscalers would fight)")
        else:
            ok(f"{spath}: ScaledObject {name} on lag of {group} as its HPA, which the component deletes")
adapter_rules = []
for path, key in (("k8s/autoscaling/prometheus-adapter-values.yaml", None),
                  ("k8s/autoscaling/prometheus-adapter-config.yaml", "config.yaml")):
    doc = next(iter(docs_by_file.get(path, [])), None)
    if not doc:
        fail(path, "missing: the prometheus-adapter rule the lag HPAs need")
        continue
    rules_ = doc["rules"]["external"] if key is None else yaml.safe_load(doc["data"][key])["externalRules"]
    lag_rules = [r for r in rules_ if r.get("name", {}).get("as") == "kafka_consumergroup_lag"
                 and "sum by (consumergroup)" in r.get("metricsQuery", "")
                 and "kafka_consumergroup_lag" in r.get("seriesQuery", "")]
    if lag_rules:
        ok(f"{path}: serves kafka_consumergroup_lag by consumer group as an External metric")
    else:
        fail(path, "no external rule serving kafka_consumergroup_lag summed by consumergroup")

# Migration Job.
jobs = [(p, d) for p, d in k8s if d["kind"] == "Job"]
if any(d["spec"]["template"]["spec"]["containers"][0].get("command", [])[-1:] == ["migrate"] for _, d in jobs):
    ok(f"{jobs[0][0]}: Job runs `sluice migrate`")
else:
    fail("k8s/", "no Job runs `sluice migrate`")

# The Secret example is marked as one and not applied by the kustomization.
secret_file = "k8s/secret.example.yaml"
if os.path.exists(secret_file):
    text = open(secret_file).read()
    if "EXAMPLE" not in text:
        fail(secret_file, "the example Secret must say it is an example")
    for _, d in ((p, d) for p, d in k8s if p == secret_file):
        for k, v in (d.get("stringData") or {}).items():
            if "password" in k.lower() and "EXAMPLE" not in str(v):
                fail(secret_file, f"{k} holds a value not marked EXAMPLE")
    ok(f"{secret_file}: marked as an example, placeholder values")
for p, d in k8s:
    if d["kind"] == "Secret" and p != secret_file:
        fail(p, "a Secret in a committed manifest; only secret.example.yaml may hold one")
    if d["kind"] == "ConfigMap" and re.search(r"(?i)(sasl\.password|password\s*=)", json.dumps(d.get("data", {}))):
        fail(p, "the ConfigMap holds a password: secrets belong in the Secret")

# kustomization lists every manifest.
kz = next(iter(docs_by_file.get("k8s/kustomization.yaml", [])), None)
if not kz:
    fail("k8s/kustomization.yaml", "missing")
else:
    listed = set(kz.get("resources", []))
    unlisted_ok = {"secret.example.yaml", "demo-upstream.yaml", "kustomization.yaml"}
    for path in sorted(glob.glob("k8s/*.yaml")):
        base = os.path.basename(path)
        if base not in listed and base not in unlisted_ok:
            fail("k8s/kustomization.yaml", f"does not list {base}")
    for r in listed:
        if not os.path.exists(os.path.join("k8s", r)):
            fail("k8s/kustomization.yaml", f"lists {r}, which does not exist")
    ok("k8s/kustomization.yaml lists every manifest")

# ------------------------------------------------------------------------------------------
# Compose.
compose_path = "deploy/compose.yaml"
compose = next(iter(docs_by_file.get(compose_path, [])), None)
if compose:
    services = compose.get("services", {})
    want = ["kafka", "scylla", "migrate", "upstream", "producer", "dispatcher", "reconciler",
            "compensator", "kafka-exporter", "prometheus", "grafana"]
    missing = [s for s in want if s not in services]
    if missing:
        fail(compose_path, f"missing services: {', '.join(missing)}")
    else:
        ok(f"{compose_path} names all services: {', '.join(want)}")
    for s in SERVICES:
        svc = services.get(s, {})
        dep = svc.get("depends_on", {})
        if not (isinstance(dep, dict) and dep.get("migrate", {}).get("condition") == "service_completed_successfully"):
            fail(compose_path, f"{s} must depend on migrate with condition service_completed_successfully")
        env = svc.get("environment", {})
        if env.get("SLUICE_LEDGER__CQL__TABLETS") != "disabled":
            fail(compose_path, f"{s}: ScyllaDB needs SLUICE_LEDGER__CQL__TABLETS=disabled")
        if s != "producer" and "SLUICE_TELEMETRY__LISTEN" not in env:
            fail(compose_path, f"{s}: no SLUICE_TELEMETRY__LISTEN (its /metrics would not be reachable)")
        if "healthcheck" not in svc:
            fail(compose_path, f"{s}: no healthcheck")
    # No working admin token may ship: the token is required from the environment (`:?`),
    # with no default (`:-` or `-`) to fall back on.
    tokens = str(services.get("producer", {}).get("environment", {}).get("SLUICE_AUTH__TOKENS", ""))
    if not re.search(r"\$\{SLUICE_ADMIN_TOKEN:\?[^}]+\}", tokens) or re.search(r"\$\{[A-Z_]+:?-", tokens):
        fail(compose_path, "SLUICE_AUTH__TOKENS must take the admin token from ${SLUICE_ADMIN_TOKEN:?...}, with no default")
    else:
        ok(f"{compose_path}: the admin token is required from the environment, no default ships")
    if str(services.get("producer", {}).get("environment", {}).get("SLUICE_PRODUCER__OPEN", "")).lower() != "false":
        fail(compose_path, "the producer must set SLUICE_PRODUCER__OPEN=false (it listens beyond loopback)")
    # The other containers reach the API as `producer`: a name it must answer to (421 otherwise).
    try:
        hosts = tomllib.loads("v = " + str(services.get("producer", {}).get("environment", {})
                                          .get("SLUICE_PRODUCER__ALLOWED_HOSTS", "[]")))["v"]
    except Exception:  # noqa: BLE001 - reported below
        hosts = []
    if "producer" not in hosts:
        fail(compose_path, "the producer must list its service name in SLUICE_PRODUCER__ALLOWED_HOSTS ('[\"producer\"]')")
    else:
        ok(f"{compose_path}: the producer answers to its service name")
    gauges = {s: str(services.get(s, {}).get("environment", {}).get("SLUICE_METRICS__COMMAND_GAUGES", "")).lower()
              for s in SERVICES}
    if [s for s, v in gauges.items() if v == "true"] != ["reconciler"]:
        fail(compose_path, f"exactly the reconciler must report the state gauges, found {gauges}")
    if services.get("migrate", {}).get("command") != ["sluice", "migrate"]:
        fail(compose_path, "migrate must run `sluice migrate`")
    if services.get("kafka", {}).get("image") != "apache/kafka:4.1.1":
        fail(compose_path, "kafka must use apache/kafka:4.1.1")
    if "KAFKA_PROCESS_ROLES" not in services.get("kafka", {}).get("environment", {}):
        fail(compose_path, "kafka is not configured for KRaft (KAFKA_PROCESS_ROLES)")
    ok(f"{compose_path}: Sluice services wait for migrate, tablets disabled, healthchecks")

# ------------------------------------------------------------------------------------------
# The image definition, statically (no Docker here): scripts/check_image.py.
sys.path.insert(0, "scripts")
import check_image  # noqa: E402

check_image.check(fail, ok, compose, compose_path, SERVICES)
# ------------------------------------------------------------------------------------------
# Prometheus and Grafana.
prom_path = "deploy/prometheus/prometheus.yml"
prom = next(iter(docs_by_file.get(prom_path, [])), None)
if prom:
    text = json.dumps(prom)
    for s in SERVICES:
        if s not in text:
            fail(prom_path, f"does not scrape {s}")
    if "kafka-exporter" not in text:
        fail(prom_path, "does not scrape kafka-exporter")
    if not any("alerts.yml" in r for r in prom.get("rule_files", [])):
        fail(prom_path, "does not load alerts.yml")
    ok(f"{prom_path} scrapes all services and the Kafka exporter, loads the alert rules")

alerts_path = "deploy/prometheus/alerts.yml"
alerts = next(iter(docs_by_file.get(alerts_path, [])), None)
if alerts:
    rules = [r for g in alerts.get("groups", []) for r in g.get("rules", [])]
    for r in rules:
        ann = r.get("annotations", {})
        for a in ("summary", "description", "runbook"):
            if not ann.get(a):
                fail(alerts_path, f"{r.get('alert')}: no {a} annotation")
        if "severity" not in r.get("labels", {}):
            fail(alerts_path, f"{r.get('alert')}: no severity label")
    exprs = " ".join(r.get("expr", "") for r in rules)
    required = {
        "STUCK now": 'sluice_commands{job="sluice", status="STUCK"}',
        "BLOCKED too long": 'status="BLOCKED"',
        "UNKNOWN past its horizon": "sluice_tool_unknown_horizon_seconds",
        "escalations": "sluice_escalations_total",
        "dead letters": "sluice_dead_letters_total",
        "dispatch p99": "histogram_quantile(0.99", "ambiguous outcomes": 'outcome="ambiguous"',
        "CAS conflicts": "sluice_cas_conflicts_total", "LWT per confirmed effect": 'kind="lwt"',
        "consumer lag": "kafka_consumergroup_lag", "service down": "up{",
        "no confirmations": "sluice_effects_submitted_total",
    }
    missing = [k for k, v in required.items() if v not in exprs]
    if missing:
        fail(alerts_path, f"no alert for: {', '.join(missing)}")
    elif "> 3.5" not in exprs:
        fail(alerts_path, "the LWT-per-effect alert must fire above 3.5")
    else:
        ok(f"{alerts_path}: {len(rules)} rules cover {', '.join(required)}; all have summary, description, runbook, severity")

dash_path = "deploy/grafana/dashboards/sluice.json"
dash = next(iter(docs_by_file.get(dash_path, [])), None)
dash_exprs = []
if dash:
    panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
    dash_exprs = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]
    blob = " ".join(e for _, e in dash_exprs)
    for metric in ("sluice_effects_submitted_total", 'to="CONFIRMED"', "STUCK|FAILED",
                   "sluice_dispatch_duration_seconds_bucket", 'outcome="ambiguous"',
                   "sluice_sweep_items_total", "sluice_dead_letters_total", "sluice_cas_conflicts_total",
                   "sluice_ledger_round_trips_total", "kafka_consumergroup_lag", "sluice_commands{",
                   "sluice_oldest_command_age_seconds", "sluice_http_request_duration_seconds_bucket",
                   "process_cpu_seconds_total", "sluice_build_info"):
        if metric not in blob:
            fail(dash_path, f"no panel queries {metric}")
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        fail(dash_path, "duplicate panel ids")
    ok(f"{dash_path}: {len(panels)} panels over the required metrics")

prov = "deploy/grafana/provisioning"
ds = next(iter(docs_by_file.get(f"{prov}/datasources/prometheus.yaml", [])), {})
if not any(d.get("type") == "prometheus" and "prometheus:9090" in d.get("url", "") for d in ds.get("datasources", [])):
    fail(f"{prov}/datasources/prometheus.yaml", "no Prometheus datasource at prometheus:9090")
dp = next(iter(docs_by_file.get(f"{prov}/dashboards/sluice.yaml", [])), {})
dash_dir = [p["options"]["path"] for p in dp.get("providers", [])]
grafana_mounts = (compose or {}).get("services", {}).get("grafana", {}).get("volumes", [])
if not any(m.endswith(f":{d}:ro") and m.startswith("./grafana/dashboards") for m in grafana_mounts for d in dash_dir):
    fail(f"{prov}/dashboards/sluice.yaml", f"provider path {dash_dir} is not where compose mounts the dashboards")
else:
    ok("Grafana provisioning: Prometheus datasource, dashboard provider path matches the compose mount")

# ------------------------------------------------------------------------------------------
# Configuration keys exist (warning only): walk the config structs from `Config`.
def parse_structs(src):
    structs = {}
    for name, body in re.findall(r"pub struct (\w+)\s*\{(.*?)\n\}", src, re.S):
        structs[name] = dict(re.findall(r"^\s*pub (\w+):\s*([^,\n]+),", body, re.M))
    return structs


structs = {}
# Every file of the config crate: its sections live beside lib.rs ([approval_links] in links.rs,
# [callbacks] in callbacks.rs, …).
for src in (*sorted(glob.glob("shared/config/src/*.rs")),
            "shared/ledger-cql/src/config.rs", "shared/ledger-cql/src/tls.rs",
            "shared/bus-kafka/src/security.rs"):
    if os.path.exists(src):
        structs.update(parse_structs(open(src).read()))
FREE_FORM = {"extra", "datacenters"}
# Replication is an internally tagged enum: class = "simple" | "network_topology".
structs.setdefault("Replication", {"class": "String", "replication_factor": "u32",
                                   "datacenters": "BTreeMap"})
known = structs


def check_key(where, path):
    node, parts = "Config", path.split(".")
    for i, p in enumerate(parts):
        fields = structs.get(node)
        if fields is None or p not in fields:
            warn(where, f"configuration key `{path}` does not exist on this branch ({node} has no "
                        f"field `{p}`): the services refuse unknown keys at start")
            return
        if p in FREE_FORM:
            return
        node = re.sub(r"^Option<(.*)>$", r"\1", fields[p].strip())


def toml_keys(t, prefix=""):
    for k, v in t.items():
        if isinstance(v, dict) and k not in ("datacenters", "extra"):
            yield from toml_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


if known:
    for f in ("deploy/distributed.toml", "k8s/config/sluice.toml"):
        with open(f, "rb") as fh:
            for key in toml_keys(tomllib.load(fh)):
                check_key(f, key)
    envs = set()
    for s in (compose or {}).get("services", {}).values():
        envs |= {(compose_path, k) for k in (s.get("environment") or {}) if k.startswith("SLUICE_") and "__" in k}
    for p, d in k8s:
        if d["kind"] in ("Deployment", "Job"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                envs |= {(p, e["name"]) for e in c.get("env", []) if "__" in e["name"]}
        if d["kind"] == "Secret":
            envs |= {(p, k) for k in (d.get("stringData") or {}) if "__" in k}
    for where, var in sorted(envs):
        check_key(where, ".".join(var[len("SLUICE_"):].lower().split("__")))
    if not any("configuration key" in w for w in warnings):
        ok("every SLUICE_ override and TOML key names an existing configuration key")

# ------------------------------------------------------------------------------------------
# Optional tools.
def run(cmd, what, where, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        out = (r.stdout + r.stderr).strip()
        fail(where, f"{what} failed:\n    " + "\n    ".join(out.splitlines()[-15:]))
        return None
    ok(what)
    return r


skipped = []
promtool = shutil.which("promtool")
if promtool:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp, "prometheus.yml")
        cfg.write_text(open(prom_path).read().replace("/etc/prometheus/alerts.yml",
                                                      os.path.abspath(alerts_path)))
        run([promtool, "check", "config", str(cfg)], f"promtool check config {prom_path}", prom_path)
        run([promtool, "check", "rules", alerts_path], f"promtool check rules {alerts_path}", alerts_path)
        run([promtool, "test", "rules", "deploy/prometheus/alerts.test.yml"],
            "promtool test rules deploy/prometheus/alerts.test.yml", "deploy/prometheus/alerts.test.yml")
        # Dashboard queries parse as PromQL (Grafana's $__rate_interval as 5m).
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:panel_{i}", "expr": e.replace("$__rate_interval", "5m")}
            for i, (_, e) in enumerate(dash_exprs)]}]}
        rf = Path(tmp, "dashboard-rules.yml")
        rf.write_text(yaml.safe_dump(rules))
        run([promtool, "check", "rules", str(rf)], f"every query of {dash_path} parses as PromQL ({len(dash_exprs)})", dash_path)
else:
    skipped.append("promtool (Debian: apt-get install prometheus)")

yamllint = shutil.which("yamllint") or next(
    (p for p in [os.path.expanduser("~/.local/bin/yamllint")] if os.path.exists(p)), None)
if yamllint:
    # PyYAML silently keeps the last of two equal keys; yamllint reports them (and syntax).
    run([yamllint, "-f", "parsable", "-d",
         "{extends: relaxed, rules: {line-length: disable}, ignore: 'deploy/helm/*/templates/'}", "deploy", "k8s"],
        "yamllint: no duplicate keys or YAML errors in deploy/ and k8s/", "deploy/, k8s/")
else:
    skipped.append("yamllint (PyPI: pip install --user yamllint)")

kubectl = shutil.which("kubectl")
rendered = None
if kubectl:
    r = run([kubectl, "kustomize", "k8s"], "kubectl kustomize k8s renders", "k8s/kustomization.yaml")
    rendered = r.stdout if r else None
    # The KEDA option as a user's overlay would use it (kustomize wants overlays outside the base).
    overlay = Path(tempfile.mkdtemp(prefix=".keda-overlay-", dir="."))
    try:
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources: [../k8s]\ncomponents: [../k8s/keda]\n")
        r = run([kubectl, "kustomize", str(overlay)], "kubectl kustomize renders k8s/ with the KEDA component",
                "k8s/keda/kustomization.yaml")
        if r:
            kinds = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(r.stdout)
                           if d and d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"))
            want = sorted([("HorizontalPodAutoscaler", "sluice-producer")]
                          + [("ScaledObject", f"sluice-{s}") for s in CONSUMERS])
            if kinds == want:
                ok("with the KEDA component: ScaledObjects for the consumers, the producer's CPU HPA alone")
            else:
                fail("k8s/keda/kustomization.yaml", f"renders autoscalers {kinds}, expected {want}")
    finally:
        shutil.rmtree(overlay)
    # The static-membership option: each consumer's instance id from its pod name, and only theirs.
    overlay = Path(tempfile.mkdtemp(prefix=".static-overlay-", dir="."))
    try:
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources: [../k8s]\ncomponents: [../k8s/static-membership]\n")
        r = run([kubectl, "kustomize", str(overlay)],
                "kubectl kustomize renders k8s/ with the static-membership component",
                "k8s/static-membership/kustomization.yaml")
        if r:
            static = sorted(
                d["metadata"]["name"] for d in yaml.safe_load_all(r.stdout)
                if d and d["kind"] == "Deployment"
                and any(e.get("name") == "SLUICE_BUS__KAFKA__INSTANCE_ID"
                        and e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
                        for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])))
            want = sorted(f"sluice-{c}" for c in CONSUMERS)
            if static == want:
                ok("with the static-membership component: the consumers' instance ids from their pod names")
            else:
                fail("k8s/static-membership/kustomization.yaml", f"sets instance ids on {static}, expected {want}")
    finally:
        shutil.rmtree(overlay)
else:
    skipped.append("kubectl kustomize")

kv = shutil.which("kubernetes-validate") or (os.path.expanduser("~/.local/bin/kubernetes-validate")
                                             if os.path.exists(os.path.expanduser("~/.local/bin/kubernetes-validate")) else None)
if kv and rendered:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(rendered)
    for version in ("1.29.0", "1.37.0"):
        run([kv, "--strict", "--quiet", "-k", version, f.name, "k8s/secret.example.yaml", "k8s/demo-upstream.yaml"],
            f"kubernetes-validate --strict (Kubernetes {version}): rendered k8s/, secret example, demo upstream", "k8s/")
    os.unlink(f.name)
else:
    skipped.append("kubernetes-validate (PyPI: pip install --user kubernetes-validate)")

compose_check = shutil.which("compose-check")
if not compose_check and shutil.which("go"):
    # Build scripts/compose-check once per version of its sources (modules from the Go proxy).
    src = Path("scripts/compose-check")
    digest = hashlib.sha256(b"".join((src / f).read_bytes() for f in ("go.mod", "go.sum", "main.go"))).hexdigest()[:12]
    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sluice" / "bin" / f"compose-check-{digest}"
    if not target.exists():
        print("building scripts/compose-check (compose-go) ...", flush=True)
        r = subprocess.run(["go", "build", "-o", str(target), "."], cwd=src, capture_output=True, text=True)
        if r.returncode:
            skipped.append("compose-go check: `go build` in scripts/compose-check failed: "
                           + (r.stderr.strip().splitlines() or ["?"])[-1])
    if target.exists():
        compose_check = str(target)
# What the compose file takes from the shell, with no default.
COMPOSE_SECRETS = {"SLUICE_ADMIN_TOKEN": "check-deploy-token-0123456789",
                   "SLUICE_COPY_KEY": "check-deploy-copy-key-0123456789abcdef"}
if compose_check:
    # With the admin token from the environment it loads; without it, it must refuse, naming it.
    run([compose_check, compose_path],
        f"compose-go loads {compose_path} (SLUICE_ADMIN_TOKEN and SLUICE_COPY_KEY set)",
        compose_path, env=dict(os.environ, **COMPOSE_SECRETS))
    # Without either secret it must refuse, naming the one missing: no default ships.
    for missing in COMPOSE_SECRETS:
        without = {k: v for k, v in dict(os.environ, **COMPOSE_SECRETS).items() if k != missing}
        r = subprocess.run([compose_check, compose_path], capture_output=True, text=True, env=without)
        if r.returncode == 0 or missing not in r.stdout + r.stderr:
            fail(compose_path, f"compose-go loads it without {missing}: a default ships")
        else:
            ok(f"compose-go refuses {compose_path} without {missing}, naming it")
elif shutil.which("docker-compose"):
    # docker-compose v1 predates the top-level `name`; validate the rest of the file.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir="deploy", delete=False) as f:
        f.write(re.sub(r"(?m)^name: .*\n", "", open(compose_path).read()))
    try:
        run(["docker-compose", "-f", f.name, "config", "-q"],
            f"docker-compose config (v1, without the top-level name) accepts {compose_path}", compose_path,
            env=dict(os.environ, **COMPOSE_SECRETS))
    finally:
        os.unlink(f.name)
else:
    skipped.append("compose validation (docker-compose from Debian, or compose-check)")

# ------------------------------------------------------------------------------------------
for w in warnings:
    print(f"WARN {w}")
for s in skipped:
    print(f"skip {s}: not installed")
for f in failures:
    print(f"FAIL {f}", file=sys.stderr)
print(f"check-deploy: {passed} passed, {len(failures)} failed" + (f", {len(warnings)} warnings" if warnings else ""))
sys.exit(1 if failures else 0)
PYEOF

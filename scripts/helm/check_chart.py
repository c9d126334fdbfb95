#!/usr/bin/env python3
"""The chart's checks, run by scripts/suites/helm.sh (which provides the tools through
SLUICE_HELM, SLUICE_KUBECONFORM, SLUICE_K8S_SCHEMAS and SLUICE_CRD_SCHEMAS). Prints one line per
check and ends with `N passed, N failed, N skipped`."""

import copy
import shutil
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

CHART = "deploy/helm/sluice"
HELM = os.environ["SLUICE_HELM"]
KUBECONFORM = os.environ["SLUICE_KUBECONFORM"]
K8S_SCHEMAS = os.environ["SLUICE_K8S_SCHEMAS"]
CRD_SCHEMAS = os.environ["SLUICE_CRD_SCHEMAS"]
K8S_VERSIONS = ["1.29.0", "1.37.0"]
SERVICES = ["producer", "dispatcher", "reconciler", "compensator"]
CONSUMERS = ["dispatcher", "reconciler", "compensator"]
RELEASE, NAMESPACE = "sluice", "payments"

passed = failed = skipped = 0


def result(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {what}")
    else:
        failed += 1
        print(f"FAIL {what}" + ("\n    " + "\n    ".join(str(detail).strip().splitlines()[-25:]) if detail else ""))
    return ok


def skip(what, why):
    global skipped
    skipped += 1
    print(f"skip {what}: {why}")


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def render(*args, release=RELEASE):
    """(manifests, error): the chart rendered with these helm arguments."""
    r = helm("template", release, CHART, "--namespace", NAMESPACE, *args)
    if r.returncode:
        return None, r.stderr.strip()
    return r.stdout, None


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(ds, kind, name=None):
    return [d for d in ds if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(ds, kind, name):
    found = find(ds, kind, name)
    return found[0] if found else None


def k8s_docs():
    out = []
    for path in sorted(glob.glob("k8s/*.yaml")):
        if path.endswith(("kustomization.yaml", "secret.example.yaml", "demo-upstream.yaml")):
            continue
        out += [d for d in docs(open(path).read()) if "kind" in d]
    return out


def container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def env_names(c):
    return [e["name"] for e in c.get("env", [])]


value_sets = {"default values": []}
for path in sorted(glob.glob(f"{CHART}/ci/*-values.yaml")):
    value_sets[os.path.relpath(path, CHART)] = ["-f", path]

# -- lint, render, schemas --------------------------------------------------------------------
rendered = {}
for name, args in value_sets.items():
    r = helm("lint", CHART, "--strict", "--namespace", NAMESPACE, *args)
    result(r.returncode == 0, f"helm lint --strict ({name})", r.stdout + r.stderr)
    text, err = render(*args)
    if result(text is not None, f"helm template ({name})", err):
        rendered[name] = text

tmp = Path(tempfile.mkdtemp(prefix="sluice-helm-"))
for name, text in rendered.items():
    f = tmp / (re.sub(r"[^a-z0-9]+", "-", name) + ".yaml")
    f.write_text(text)
    kinds = sorted({d["kind"] for d in docs(text)})
    for version in K8S_VERSIONS:
        r = subprocess.run([KUBECONFORM, "-strict", "-summary", "-kubernetes-version", version,
                            "-schema-location", f"file://{K8S_SCHEMAS}/{{{{.NormalizedKubernetesVersion}}}}-local-strict/{{{{.ResourceKind}}}}{{{{.KindSuffix}}}}.json",
                            "-schema-location", f"file://{CRD_SCHEMAS}/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json",
                            str(f)], capture_output=True, text=True)
        summary = (r.stdout.strip().splitlines() or ["?"])[-1]
        result(r.returncode == 0 and "Errors: 0" in summary and "Invalid: 0" in summary,
               f"kubeconform -strict, Kubernetes {version} and the CRDs ({name}: {summary.split(' - ')[-1]}; {', '.join(kinds)})",
               r.stdout + r.stderr)

default = docs(rendered.get("default values", ""))
full = docs(rendered.get("ci/all-features-values.yaml", ""))
fixed = docs(rendered.get("ci/oauth-fixed-values.yaml", ""))
if not default:
    print(f"{passed} passed, {failed + 1} failed, {skipped} skipped")
    sys.exit(1)

# -- the same as the kustomize base -------------------------------------------------------------
base = k8s_docs()
chart_version = yaml.safe_load(open(f"{CHART}/Chart.yaml"))["appVersion"]
workspace = tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]
workspace_version, repository = workspace["version"], workspace["repository"]
result(chart_version == workspace_version,
       f"Chart.yaml appVersion {chart_version} is the workspace version {workspace_version}")

cm = one(default, "ConfigMap", "sluice-config")
k8s_cm = one(base, "ConfigMap", "sluice-config")
chart_config = tomllib.loads(cm["data"]["sluice.toml"])
base_config = tomllib.load(open("k8s/config/sluice.toml", "rb"))


def diff(a, b, path=""):
    out = []
    for k in sorted(set(a) | set(b)):
        p = f"{path}{k}"
        if k not in a:
            out.append(f"{p}: only in k8s ({b[k]!r})")
        elif k not in b:
            out.append(f"{p}: only in the chart ({a[k]!r})")
        elif isinstance(a[k], dict) and isinstance(b[k], dict):
            out += diff(a[k], b[k], p + ".")
        elif a[k] != b[k] or type(a[k]) is not type(b[k]):
            out.append(f"{p}: chart {a[k]!r}, k8s {b[k]!r}")
    return out


d = diff(chart_config, base_config)
result(not d, f"the chart's sluice.toml has the keys and values of k8s/config/sluice.toml ({len(list(re.finditer('=', cm['data']['sluice.toml'])))} settings)", "\n".join(d))
result(cm["data"]["catalog.toml"] == k8s_cm["data"]["catalog.toml"],
       "the chart's default catalog is the kustomize ConfigMap's (the example catalog)")

# The chart's own TOML writer (Helm's toToml writes integers as floats): arrays of tables,
# secret references, quotes and backslashes in strings, keys that need quoting, big integers.
values = tmp / "toml-values.yaml"
values.write_text(yaml.safe_dump({"config": {
    "bus": {"copy_keys": [{"id": "2026-11", "secret": {"env": "SLUICE_COPY_KEY"}}],
            "kafka": {"extra": {"fetch.max.bytes": "52428800"}}},
    "reconciler": {"purge_every_ms": 86400000000, "purge_batch": 500},
    "telemetry": {"log_level": 'sluice=debug,info "quoted" \\ back'},
    "producer": {"allowed_origins": ["https://ops.example.com", "https://b.example.com"]},
    "x": {"ratio": 0.25, "flag": True, "empty": []}}}))
text, err = render("-f", str(values), "--show-only", "templates/configmap.yaml")
got = tomllib.loads(yaml.safe_load(text)["data"]["sluice.toml"]) if text else {}
want = {"copy_keys": [{"id": "2026-11", "secret": {"env": "SLUICE_COPY_KEY"}}], "purge_every_ms": 86400000000,
        "log_level": 'sluice=debug,info "quoted" \\ back', "extra": "52428800", "ratio": 0.25, "flag": True, "empty": []}
have = {"copy_keys": got.get("bus", {}).get("copy_keys"), "purge_every_ms": got.get("reconciler", {}).get("purge_every_ms"),
        "log_level": got.get("telemetry", {}).get("log_level"),
        "extra": got.get("bus", {}).get("kafka", {}).get("extra", {}).get("fetch.max.bytes"),
        "ratio": got.get("x", {}).get("ratio"), "flag": got.get("x", {}).get("flag"), "empty": got.get("x", {}).get("empty")}
result(have == want and type(have["purge_every_ms"]) is int,
       "the chart's TOML writer keeps integers integers, arrays of tables, quoted keys and escaped strings", err or f"{have}\n!= {want}")

for svc in SERVICES:
    name = f"sluice-{svc}"
    dep, kdep = one(default, "Deployment", name), one(base, "Deployment", name)
    if not result(dep is not None and kdep is not None, f"Deployment {name} in both"):
        continue
    c, kc = container(dep), container(kdep)
    spec, kspec = dep["spec"]["template"]["spec"], kdep["spec"]["template"]["spec"]
    problems = []
    for k in ("startupProbe", "readinessProbe", "livenessProbe"):
        want = copy.deepcopy(kc[k])
        want["httpGet"].setdefault("scheme", "HTTP")
        if c.get(k) != want:
            problems.append(f"{k}: chart {c.get(k)}, k8s {want}")
    for k in ("securityContext", "resources", "ports", "command", "lifecycle"):
        if c.get(k) != kc.get(k):
            problems.append(f"container {k}: chart {c.get(k)}, k8s {kc.get(k)}")
    for k in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken"):
        if spec.get(k) != kspec.get(k):
            problems.append(f"pod {k}: chart {spec.get(k)}, k8s {kspec.get(k)}")
    if dep["spec"]["strategy"] != kdep["spec"]["strategy"]:
        problems.append(f"strategy: chart {dep['spec']['strategy']}, k8s {kdep['spec']['strategy']}")
    tsc, ktsc = spec.get("topologySpreadConstraints", []), kspec.get("topologySpreadConstraints", [])
    strip = lambda t: {k: v for k, v in t.items() if k != "labelSelector"}
    if [strip(t) for t in tsc] != [strip(t) for t in ktsc] or not all(
            t["labelSelector"]["matchLabels"].get("app.kubernetes.io/component") == svc for t in tsc):
        problems.append(f"topologySpreadConstraints: chart {tsc}, k8s {ktsc}")
    missing = [n for n in env_names(kc) if n.startswith("SLUICE_") and n not in env_names(c)]
    if missing:
        problems.append(f"environment the kustomize base sets and the chart does not: {missing}")
    gauges = [e for e in c.get("env", []) if e["name"] == "SLUICE_METRICS__COMMAND_GAUGES"]
    if (svc == "reconciler") != bool(gauges):
        problems.append("exactly the reconciler reports the state gauges")
    result(not problems, f"{name}: probes, security context, resources, grace period "
           f"{spec.get('terminationGracePeriodSeconds')} s, strategy, topology spread and SLUICE_ "
           f"environment as in k8s/{svc}.yaml", "\n".join(problems))

    pdb, kpdb = one(default, "PodDisruptionBudget", name), one(base, "PodDisruptionBudget", name)
    sel = pdb and pdb["spec"]["selector"]["matchLabels"]
    result(pdb is not None and {k: v for k, v in pdb["spec"].items() if k != "selector"}
           == {k: v for k, v in kpdb["spec"].items() if k != "selector"}
           and all(dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items()),
           f"{name}: PodDisruptionBudget as k8s's, selecting its pods")
    s, ks = one(default, "Service", name), one(base, "Service", name)
    result(s is not None and s["spec"]["ports"] == ks["spec"]["ports"]
           and s["spec"].get("clusterIP") == ks["spec"].get("clusterIP")
           and all(dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in s["spec"]["selector"].items()),
           f"{name}: Service ports and kind as k8s's, selecting its pods")
    h, kh = one(default, "HorizontalPodAutoscaler", name), one(base, "HorizontalPodAutoscaler", name)
    result(h is not None and {k: v for k, v in h["spec"].items()} == kh["spec"],
           f"{name}: HorizontalPodAutoscaler as k8s's (bounds, metric, target, behaviour)",
           f"chart {h and h['spec']}\nk8s {kh['spec']}")

# The producer answers to its Service's names, qualified by the release's namespace.
prod = container(one(default, "Deployment", "sluice-producer"))
hosts = next((e["value"] for e in prod["env"] if e["name"] == "SLUICE_PRODUCER__ALLOWED_HOSTS"), "[]")
want = [f"sluice-producer{q}" for q in ("", f".{NAMESPACE}", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local")]
result(tomllib.loads("v = " + hosts)["v"] == want, f"the producer answers to its Service's names ({', '.join(want)})", hosts)

# The migration: the kustomize Job's settings, as a pre-install/pre-upgrade hook.
job, kjob = one(default, "Job", "sluice-migrate"), one(base, "Job", "sluice-migrate")
problems = []
if job is None:
    problems.append("no Job sluice-migrate")
else:
    ann = job["metadata"].get("annotations", {})
    if set(ann.get("helm.sh/hook", "").split(",")) != {"pre-install", "pre-upgrade"}:
        problems.append(f"helm.sh/hook is {ann.get('helm.sh/hook')!r}")
    if "before-hook-creation" not in ann.get("helm.sh/hook-delete-policy", ""):
        problems.append("no hook-delete-policy before-hook-creation: a second upgrade would meet the old Job")
    jc, kjc = container(job), container(kjob)
    for k in ("command", "resources", "securityContext"):
        if jc.get(k) != kjc.get(k):
            problems.append(f"{k}: chart {jc.get(k)}, k8s {kjc.get(k)}")
    for k in ("backoffLimit", "activeDeadlineSeconds"):
        if job["spec"].get(k) != kjob["spec"].get(k):
            problems.append(f"{k}: chart {job['spec'].get(k)}, k8s {kjob['spec'].get(k)}")
    # What the hook Job mounts must exist before it: hooks of a lower weight, same events.
    spec = job["spec"]["template"]["spec"]
    needs = {("ServiceAccount", spec["serviceAccountName"])} | {
        ("ConfigMap", v["configMap"]["name"]) for v in spec["volumes"] if "configMap" in v}
    for kind, n in needs:
        dep = one(default, kind, n)
        dann = (dep or {}).get("metadata", {}).get("annotations", {})
        if not dep or dann.get("helm.sh/hook") != ann.get("helm.sh/hook") \
                or int(dann.get("helm.sh/hook-weight", 0)) >= int(ann.get("helm.sh/hook-weight", 0)):
            problems.append(f"the Job needs {kind} {n}, which is not a hook created before it")
        elif dep.get("data") and dep["data"] != cm["data"]:
            problems.append(f"{kind} {n} differs from the services' ConfigMap")
result(not problems, "the migration: k8s's Job (sluice migrate, limits, security) as a pre-install,pre-upgrade hook "
       "with its own ConfigMap and ServiceAccount created before it, deleted by policy", "\n".join(problems))

# The tool-service policy, scoped to the release.
tp, ktp = one(default, "NetworkPolicy", "sluice-tool-services"), one(base, "NetworkPolicy", "sluice-tool-services")
exprs = tp and {e["key"]: e["values"] for e in tp["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]}
kexprs = {e["key"]: e["values"] for e in ktp["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]}
result(tp is not None and tp["spec"]["podSelector"] == ktp["spec"]["podSelector"]
       and tp["spec"]["ingress"][0]["ports"] == ktp["spec"]["ingress"][0]["ports"]
       and {k: v for k, v in exprs.items() if k != "app.kubernetes.io/instance"} == kexprs
       and exprs.get("app.kubernetes.io/instance") == [RELEASE],
       "NetworkPolicy sluice-tool-services as k8s's, open to this release's callers only")

# -- the configuration's checksum rolls the pods -------------------------------------------------
def checksums(ds):
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"].get("sluice.dev/config-checksum")
            for d in find(ds, "Deployment")}


base_sums = checksums(default)
for what, args, changes in (
        ("a configuration change (config.dispatcher.concurrency=32)", ["--set", "config.dispatcher.concurrency=32"], True),
        ("a catalog change", ["--set-string", "catalog=policy_version = \"2027-01-01\""], True),
        ("a replica count change (producer.replicas=5)", ["--set", "producer.replicas=5"], False)):
    text, err = render(*args)
    sums = checksums(docs(text)) if text else {}
    if changes:
        ok = text is not None and len(sums) == 4 and all(sums[n] and sums[n] != base_sums[n] for n in sums)
        result(ok, f"{what} changes the checksum annotation of all four pod templates (they roll)", err or sums)
    else:
        result(text is not None and sums == base_sums, f"{what} leaves the checksums alone (no needless roll)", err or sums)

# -- the release's consumer groups ---------------------------------------------------------------
def lag_groups(ds):
    out = {}
    for h in find(ds, "HorizontalPodAutoscaler"):
        for m in h["spec"]["metrics"]:
            if m["type"] == "External":
                out[h["metadata"]["name"]] = m["external"]["metric"]["selector"]["matchLabels"]["consumergroup"]
    for so in find(ds, "ScaledObject"):
        q = so["spec"]["triggers"][0]["metadata"]["query"]
        out[so["metadata"]["name"]] = re.search(r'consumergroup="([^"]+)"', q).group(1)
    return out


for what, args, prefix in (("default values", [], "sluice-"),
                           ("topic prefix staging.", ["--set", "config.bus.topic_prefix=staging."], "staging-"),
                           ("topic prefix team_b_", ["--set", "config.bus.topic_prefix=team_b_"], "team_b-"),
                           ("group prefix team-a.sluice- with KEDA", ["-f", f"{CHART}/ci/all-features-values.yaml"], "team-a.sluice-")):
    text, err = render(*args)
    groups = lag_groups(docs(text)) if text else {}
    want = {f"sluice-{c}": f"{prefix}{c}" for c in CONSUMERS}
    result(groups == want, f"autoscalers read the lag of the release's groups ({what}: {', '.join(sorted(set(groups.values())))})",
           err or f"{groups} != {want}")

# -- KEDA as the kustomize component -------------------------------------------------------------
keda_base = docs(open("k8s/keda/scaledobjects.yaml").read())
text, err = render("--set", "keda.enabled=true")
kd = docs(text) if text else []
problems = [] if text else [err]
for c in CONSUMERS:
    so, kso = one(kd, "ScaledObject", f"sluice-{c}"), one(keda_base, "ScaledObject", f"sluice-{c}")
    if so is None:
        problems.append(f"no ScaledObject sluice-{c}")
        continue
    if so["spec"] != kso["spec"]:
        problems.append(f"sluice-{c}: chart {so['spec']}\nk8s {kso['spec']}")
    if one(kd, "HorizontalPodAutoscaler", f"sluice-{c}"):
        problems.append(f"sluice-{c}: an HPA beside the ScaledObject (two autoscalers fight)")
if not one(kd, "HorizontalPodAutoscaler", "sluice-producer"):
    problems.append("the producer lost its CPU HPA")
result(not problems, "keda.enabled: the ScaledObjects of k8s/keda (bounds, targets, behaviour, query), "
       "no HPA beside them, the producer's CPU HPA kept", "\n".join(problems))
so = one(full, "ScaledObject", "sluice-dispatcher")
result(so is not None and so["spec"]["maxReplicaCount"] == 32 and so["spec"]["minReplicaCount"] == 3
       and so["spec"]["triggers"][0]["metadata"]["threshold"] == "150",
       "a ScaledObject takes its bounds and lag target from the component's autoscaling values")
result(not [d for d in fixed if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]
       and {d["metadata"]["name"]: d["spec"].get("replicas") for d in find(fixed, "Deployment")}
       == {"sluice-producer": 3, "sluice-dispatcher": 4, "sluice-reconciler": 2, "sluice-compensator": 2},
       "autoscaling off: no autoscaler, the Deployments keep the replicas given")
result(all("replicas" not in d["spec"] for d in find(default, "Deployment")),
       "autoscaled Deployments leave replicas to their autoscaler (an upgrade does not reset it)")

# -- the alert rules and the dashboard are deploy/'s ---------------------------------------------
alerts = yaml.safe_load(open("deploy/prometheus/alerts.yml"))
text, err = render("--set", "prometheusRule.enabled=true")
rule = one(docs(text), "PrometheusRule", "sluice") if text else None
result(rule is not None and rule["spec"]["groups"] == alerts["groups"],
       f"the PrometheusRule's groups are deploy/prometheus/alerts.yml's ({sum(len(g['rules']) for g in alerts['groups'])} rules)",
       err or "they differ")
frule = one(full, "PrometheusRule", "sluice")
problems = []
if frule is None:
    problems.append("no PrometheusRule in the all-features rendering")
else:
    fr = {r["alert"]: r for g in frule["spec"]["groups"] for r in g["rules"]}
    for g in alerts["groups"]:
        for r in g["rules"]:
            got = copy.deepcopy(fr.get(r["alert"]))
            if got is None:
                problems.append(f"{r['alert']} missing")
                continue
            url = got["annotations"].pop("runbook_url", "")
            want_url = r["annotations"]["runbook_url"].replace(
                f"{repository}/blob/main/docs/", "https://docs.internal.example.com/sluice/")
            if url != want_url:
                problems.append(f"{r['alert']}: runbook_url {url}, expected {want_url}")
            expected = copy.deepcopy(r)
            expected["annotations"].pop("runbook_url")
            if r["alert"] == "SluiceConsumerLagHigh":
                m = re.search(r'consumergroup=~"((?:[^"\\]|\\.)*)"', got["expr"])
                regex = m and m.group(1).replace("\\\\", "\\")
                if not regex or not re.fullmatch(regex, "team-a.sluice-dispatcher") \
                        or re.fullmatch(regex, "team-aXsluice-dispatcher") or re.fullmatch(regex, "sluice-dispatcher"):
                    problems.append(f"SluiceConsumerLagHigh's group matcher {regex!r} does not name the release's groups exactly")
                got["expr"] = expected["expr"]
            if got != expected:
                problems.append(f"{r['alert']} differs from alerts.yml")
result(not problems, "with a group prefix and a runbook base: only SluiceConsumerLagHigh's groups and the runbook links change",
       "\n".join(problems))

dash = one(full, "ConfigMap", "sluice-dashboard")
result(dash is not None and json.loads(dash["data"]["sluice.json"]) == json.load(open("deploy/grafana/dashboards/sluice.json"))
       and dash["metadata"]["labels"].get("grafana_dashboard") == "1" and dash["metadata"].get("namespace") == "monitoring",
       "the Grafana dashboard ConfigMap holds deploy/grafana/dashboards/sluice.json, with the sidecar's label, in the namespace given")

problems = []
for c in SERVICES:
    sm = one(full, "ServiceMonitor", f"sluice-{c}")
    svc = one(full, "Service", f"sluice-{c}")
    if not sm or not svc:
        problems.append(f"no ServiceMonitor or Service sluice-{c}")
        continue
    ep = sm["spec"]["endpoints"][0]
    if not all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items()):
        problems.append(f"sluice-{c}: the ServiceMonitor does not select its Service")
    if ep["port"] not in [p["name"] for p in svc["spec"]["ports"]] or ep.get("path") != "/metrics":
        problems.append(f"sluice-{c}: endpoint {ep} is not a port of its Service with /metrics")
    labels = {r.get("targetLabel"): r for r in ep.get("relabelings", [])}
    if labels.get("job", {}).get("replacement") != "sluice" or \
            labels.get("service", {}).get("sourceLabels") != ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]:
        problems.append(f"sluice-{c}: targets are not labelled job=\"sluice\", service=<component>")
    if sm["metadata"]["labels"].get("release") != "kube-prometheus-stack":
        problems.append(f"sluice-{c}: serviceMonitor.labels not applied")
    if c == "producer" and ep.get("scheme") != "https":
        problems.append("the producer serves HTTPS (producer.tls) but is scraped over HTTP")
result(not problems, "a ServiceMonitor per service on its /metrics, labelled job=\"sluice\" and service=<component> "
       "as the alerts and the dashboard expect", "\n".join(problems))

# -- credentials come from Secrets, never the ConfigMap ------------------------------------------
problems = []
for ds, name in ((default, "default"), (full, "all features"), (fixed, "oauth")):
    for d in find(ds, "ConfigMap"):
        blob = json.dumps(d.get("data", {}))
        if re.search(r"(?i)password\s*=|client_secret\s*=|secret\s*=\s*\\\"", blob):
            problems.append(f"{name}: ConfigMap {d['metadata']['name']} holds a secret")
    for d in find(ds, "Deployment") + find(ds, "Job"):
        for e in container(d).get("env", []):
            if re.search(r"PASSWORD|CLIENT_SECRET|USERNAME|TOKENS|KEYS", e["name"]) and "value" in e:
                problems.append(f"{name}: {d['metadata']['name']} sets {e['name']} as a plain value")
fdep = container(one(full, "Deployment", "sluice-dispatcher"))
refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in fdep["env"] if "secretKeyRef" in e.get("valueFrom", {})}
want = {"SLUICE_BUS__KAFKA__BROKERS": "kafka-brokers", "SLUICE_BUS__KAFKA__SASL__USERNAME": "kafka-username",
        "SLUICE_BUS__KAFKA__SASL__PASSWORD": "kafka-password", "SLUICE_LEDGER__CQL__USERNAME": "cql-username",
        "SLUICE_LEDGER__CQL__PASSWORD": "cql-password"}
if {k: v["key"] for k, v in refs.items()} != want or {v["name"] for v in refs.values()} != {"team-a-sluice"}:
    problems.append(f"engine credentials: {refs}")
mounts = {m["mountPath"] for m in fdep["volumeMounts"]}
cas = {e["name"]: e["value"] for e in fdep["env"] if e["name"].endswith("CA_FILE")}
if "/etc/sluice-engines" not in mounts or cas != {"SLUICE_BUS__KAFKA__TLS__CA_FILE": "/etc/sluice-engines/kafka-ca.pem",
                                                  "SLUICE_LEDGER__CQL__TLS__CA_FILE": "/etc/sluice-engines/cql-ca.pem"}:
    problems.append(f"engine CAs: mounts {mounts}, settings {cas}")
odep = container(one(fixed, "Deployment", "sluice-dispatcher"))
orefs = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in odep["env"] if "secretKeyRef" in e.get("valueFrom", {})}
if orefs != {"SLUICE_BUS__KAFKA__OAUTHBEARER__CLIENT_ID": "oidc-client-id",
             "SLUICE_BUS__KAFKA__OAUTHBEARER__CLIENT_SECRET": "oidc-client-secret"}:
    problems.append(f"OAUTHBEARER credentials: {orefs}")
for d in find(full, "Deployment") + find(full, "Job"):
    if container(d).get("envFrom") != [{"secretRef": {"name": "team-a-sluice"}}]:
        problems.append(f"{d['metadata']['name']}: not given existingSecret's SLUICE_ variables")
result(not problems, "credentials only from Secrets: SASL or OAUTHBEARER, CQL and the CAs from existingSecret's keys, "
       "the rest of its keys as environment; no secret in a ConfigMap or a plain value", "\n".join(problems))

es = one(full, "ExternalSecret", "sluice")
ea = (es or {}).get("metadata", {}).get("annotations", {})
result(es is not None and es["spec"]["target"]["name"] == "team-a-sluice" and es["spec"]["target"]["creationPolicy"] == "Orphan"
       and set(ea.get("helm.sh/hook", "").split(",")) == {"pre-install", "pre-upgrade"}
       and int(ea.get("helm.sh/hook-weight", 0)) < int(one(full, "Job", "sluice-migrate")["metadata"]["annotations"]["helm.sh/hook-weight"]),
       "the ExternalSecret fills existingSecret, created as a hook before the migration, its Secret kept across upgrades")
result(not find(default, "ExternalSecret") and not find(default, "ServiceMonitor") and not find(default, "PrometheusRule")
       and not find(default, "ScaledObject") and [d["metadata"]["name"] for d in find(default, "NetworkPolicy")] == ["sluice-tool-services"],
       "the default values render no custom resource and no NetworkPolicy but the tool services' (as the kustomize base)")

# -- NetworkPolicies: default deny, then what each service needs ---------------------------------
def selects(selector, labels):
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
            return False
    return True


def policies_for(ds, labels, kind):
    return [p for p in find(ds, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)
            and kind in p["spec"].get("policyTypes", [])]


def allows(ds, labels, kind, port, peer=None):
    """Whether some policy selecting these pods allows `kind` traffic on `port` (and, if given,
    a rule whose peers contain `peer`)."""
    key = "egress" if kind == "Egress" else "ingress"
    side = "to" if kind == "Egress" else "from"
    for p in policies_for(ds, labels, kind):
        for rule in p["spec"].get(key, []):
            ports = [x.get("port") for x in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get(side)
            if peer is None or (peers and peer in peers) or (peer == "any" and not peers):
                return True
    return False


problems = []
pods = {c: one(full, "Deployment", f"sluice-{c}")["spec"]["template"]["metadata"]["labels"] for c in SERVICES}
pods["migrate"] = one(full, "Job", "sluice-migrate")["spec"]["template"]["metadata"]["labels"]
deny = one(full, "NetworkPolicy", "sluice-default-deny")
if not deny or set(deny["spec"]["policyTypes"]) != {"Ingress", "Egress"} or deny["spec"].get("ingress") or deny["spec"].get("egress"):
    problems.append("no default-deny policy (Ingress and Egress, no rule)")
kafka_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}
cql_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db"}}}
for c, labels in pods.items():
    if deny and not selects(deny["spec"]["podSelector"], labels):
        problems.append(f"{c}: not under the default deny")
    for what, port, peer in (("DNS", 53, None), ("Kafka", 9092, kafka_peer), ("CQL", 9042, cql_peer)):
        if not allows(full, labels, "Egress", port, peer):
            problems.append(f"{c}: no egress to {what} ({port})")
    if c in CONSUMERS:
        if not allows(full, labels, "Egress", 443, {"ipBlock": {"cidr": "203.0.113.0/24"}}):
            problems.append(f"{c}: no egress to the upstreams' CIDRs")
        if not allows(full, labels, "Egress", "sluice-tool", {"podSelector": {"matchLabels": {"sluice.dev/tool-service": "true"}}}):
            problems.append(f"{c}: no egress to the tool services")
        if not allows(fixed, labels, "Egress", 443, "any"):
            problems.append(f"{c}: allowAllEgressTo443 does not open 443")
    elif allows(full, labels, "Egress", 443, {"ipBlock": {"cidr": "203.0.113.0/24"}}) or allows(fixed, labels, "Egress", 443, "any"):
        problems.append(f"{c}: may reach the upstreams, which only the dispatcher, reconciler and compensator call")
    if c in SERVICES:
        port = "http" if c == "producer" else "metrics"
        if not allows(full, labels, "Ingress", port, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}):
            problems.append(f"{c}: no ingress for scrapes from the monitoring namespace on {port}")
agents = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}
if not allows(full, pods["producer"], "Ingress", "http", agents):
    problems.append("producer: the API is not open to the configured sources")
for c in CONSUMERS + ["migrate"]:
    if allows(full, pods[c], "Ingress", "http", agents):
        problems.append(f"{c}: takes the producer's API traffic")
result(not problems, "NetworkPolicies: default deny for the release's pods and the migration; DNS, Kafka and CQL for all; "
       "upstreams (CIDRs, tool services, or any 443) for the dispatcher, reconciler and compensator only; "
       "the API from the configured sources; scrapes from the monitoring namespace", "\n".join(problems))

# -- bad values are refused, naming what is wrong ------------------------------------------------
for what, args, expect in (
        ("an unknown key", ["--set", "dispatcher.replica=3"], "replica"),
        ("a partition count that is not a number", ["--set", "config.bus.partitions=many"], "/config/bus/partitions"),
        ("a group prefix with a space", ["--set", "config.bus.kafka.group_prefix=team a"], "/config/bus/kafka/group_prefix"),
        ("maxReplicas above the partitions", ["--set", "dispatcher.autoscaling.maxReplicas=65"], "dispatcher.autoscaling.maxReplicas (65) must be at most config.bus.partitions (64)"),
        ("SASL keys without a mechanism", ["--set", "existingSecret=s", "--set", "engines.kafka.sasl.passwordKey=p"], "config.bus.kafka.sasl.mechanism"),
        ("SASL and OAUTHBEARER both", ["-f", f"{CHART}/ci/oauth-fixed-values.yaml", "--set", "engines.kafka.sasl.passwordKey=p",
                                        "--set", "config.bus.kafka.sasl.mechanism=plain"], "exclude each other"),
        ("engine keys without a Secret", ["--set", "engines.cql.passwordKey=p"], "engines.existingSecret"),
        ("an ExternalSecret without existingSecret", ["--set", "externalSecret.enabled=true", "--set", "externalSecret.secretStoreRef.name=v"], "set existingSecret"),
        ("HTTPS without a certificate", ["--set", "producer.tls.enabled=true"], "producer.tls.secretName"),
        ("an image digest that is not one", ["--set", "image.digest=latest"], "/image/digest"),
        ("the callback key in values (a ConfigMap)", ["--set", "config.callbacks.secret=k"], "'secret' not allowed"),
        ("a callback address that is not http(s)", ["--set", "config.callbacks.public_url=ftp://x"], "/config/callbacks/public_url")):
    text, err = render(*args)
    result(text is None and expect in (err or ""), f"refused: {what} (naming {expect!r})", err or "rendered")

# -- the real binary loads what the chart renders -----------------------------------------------
sluice = os.environ.get("SLUICE_BIN")
if not sluice or not os.access(sluice, os.X_OK):
    skip("sluice migrate --print on the rendered configurations", "SLUICE_BIN is not set to a built sluice binary")
    skip("sluice catalog check on the rendered catalogs", "SLUICE_BIN is not set")
else:
    for name, ds in (("default values", default), ("ci/all-features-values.yaml", full), ("ci/oauth-fixed-values.yaml", fixed)):
        cmap = one(ds, "ConfigMap", "sluice-config")
        work = tmp / f"config-{re.sub(r'[^a-z0-9]+', '-', name)}"
        work.mkdir()
        (work / "sluice.toml").write_text(cmap["data"]["sluice.toml"])
        (work / "catalog.toml").write_text(cmap["data"].get("catalog.toml", open("deploy/catalog.toml").read()))
        # Each service's environment as its pod gets it; Secret values and pod fields stand in.
        for c in SERVICES:
            env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
            for e in container(one(ds, "Deployment", f"sluice-{c}")).get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif "secretKeyRef" in e.get("valueFrom", {}):
                    env[e["name"]] = '["scylla-a:9042"]' if e["name"].endswith("NODES") else \
                        "kafka-a:9092" if e["name"].endswith("BROKERS") else f"stand-in-{e['valueFrom']['secretKeyRef']['key']}"
                else:
                    env[e["name"]] = "pod-0"
            env["SLUICE_CONFIG"] = str(work / "sluice.toml")
            env["SLUICE_CATALOG__PATH"] = str(work / "catalog.toml")
            for k in [k for k in env if k.endswith("_FILE")]:
                Path(work, os.path.basename(env[k])).write_text("stand-in\n")
                env[k] = str(work / os.path.basename(env[k]))
            # The API's tokens come from existingSecret in a real install.
            env["SLUICE_AUTH__TOKENS"] = '[{ name = "ci", role = "admin", token_sha256 = "' + "0" * 64 + '" }]'
            r = subprocess.run([sluice, "migrate", "--print"], capture_output=True, text=True, env=env)
            result(r.returncode == 0 and "CREATE TABLE" in r.stdout.upper(),
                   f"sluice migrate --print loads the {c}'s rendered configuration and environment ({name})",
                   r.stderr or r.stdout[-500:])
        if cmap["data"].get("catalog.toml"):
            r = subprocess.run([sluice, "catalog", "check", "--catalog", str(work / "catalog.toml")],
                               capture_output=True, text=True, env=dict(os.environ, SLUICE_UPSTREAM_URL="http://sluice-upstream:8787"))
            result(r.returncode == 0, f"sluice catalog check accepts the rendered catalog ({name})", r.stderr or r.stdout)

shutil.rmtree(tmp, ignore_errors=True)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)

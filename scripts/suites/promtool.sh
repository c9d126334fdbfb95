#!/usr/bin/env bash
# The alert rules and the Grafana dashboard, checked by Prometheus's own promtool:
#
#   * `promtool check config` of deploy/prometheus/prometheus.yml and `check rules` of alerts.yml;
#   * every test group of deploy/prometheus/alerts.test.yml, one `promtool test rules` each (the
#     state alerts hold while a command is STUCK, BLOCKED past an hour, UNKNOWN past its tool's
#     horizon, and clear after);
#   * the dashboard's JSON model (no Grafana server installs from the registries this project
#     uses, so it is not loaded into one): generated from scripts/gen-grafana-dashboard.py,
#     unique panel ids, a grid of 24 columns without overlaps, every query on the templated
#     Prometheus datasource with a unique refId, every query parsing as PromQL;
#   * every sluice_ metric the alerts and the dashboard read is one shared/runtime/src/metrics.rs
#     defines (a renamed metric would leave an alert that can never fire).
#
# promtool comes from Debian's `prometheus` package, installed when missing.
# Ends with `N passed, N failed, N skipped` (scripts/suites/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool is missing: installing Debian's prometheus package"
  if ! { apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 ||
         { apt-get update -qq >/dev/null 2>&1 &&
           apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; }; }; then
    echo "FAIL cannot install promtool (apt-get install prometheus)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
fi
if ! python3 -c 'import yaml' 2>/dev/null; then
  python3 -m pip install --user --quiet pyyaml
fi
promtool --version 2>&1 | head -1

exec python3 - <<'PYEOF'
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

passed, failed = 0, 0


def result(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {what}")
    else:
        failed += 1
        print(f"FAIL {what}" + (f"\n    " + "\n    ".join(detail.strip().splitlines()[-20:]) if detail else ""))


def promtool(*args):
    r = subprocess.run(["promtool", *args], capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr


tmp = Path(tempfile.mkdtemp(prefix="sluice-promtool-"))
prom_path = "deploy/prometheus/prometheus.yml"
alerts_path = "deploy/prometheus/alerts.yml"
tests_path = "deploy/prometheus/alerts.test.yml"
dash_path = "deploy/grafana/dashboards/sluice.json"

# -- Prometheus configuration and rules ----------------------------------------------------
cfg = tmp / "prometheus.yml"
cfg.write_text(open(prom_path).read().replace("/etc/prometheus/alerts.yml", os.path.abspath(alerts_path)))
result(*promtool("check", "config", str(cfg))[:1], f"promtool check config {prom_path}")
ok, out = promtool("check", "rules", alerts_path)
result(ok, f"promtool check rules {alerts_path}", "" if ok else out)

# -- Each test group of the unit tests on its own, named by its comment --------------------
tests = yaml.safe_load(open(tests_path))
titles = re.findall(r"(?m)^  # (.*)\n(?:  #.*\n)*  - interval:", open(tests_path).read())
(tmp / "alerts.yml").write_text(open(alerts_path).read())
tested = set()
for i, group in enumerate(tests["tests"]):
    title = titles[i] if i < len(titles) else f"group {i + 1}"
    one = dict(tests, tests=[group])
    path = tmp / f"test-{i}.yml"
    path.write_text(yaml.safe_dump(one, sort_keys=False))
    ok, out = promtool("test", "rules", str(path))
    names = sorted({t["alertname"] for t in group.get("alert_rule_test", [])})
    tested |= set(names)
    result(ok, f"alerts.test.yml: {title} ({', '.join(names)})", "" if ok else out)
rules = [r for g in yaml.safe_load(open(alerts_path))["groups"] for r in g["rules"]]
state = ["SluiceCommandsStuck", "SluiceApprovalWaitingLong", "SluiceUnknownPastHorizon"]
missing = [a for a in state if a not in tested]
result(not missing, f"the state alerts have unit tests ({', '.join(state)})",
       f"no test for {', '.join(missing)}" if missing else "")

# -- Every alert links to its runbook: a section of docs/operations.md ----------------------
# runbook_url = <Cargo.toml's workspace repository>/blob/main/docs/<doc>#<anchor>, and the doc
# has a heading whose GitHub anchor is <anchor> (lower case, spaces to '-', punctuation dropped).
import tomllib
repository = tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["repository"]
base = f"{repository}/blob/main/docs/"


def anchors(doc):
    out = set()
    for heading in re.findall(r"(?m)^#+ (.*)$", open(doc).read()):
        out.add(re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-"))
    return out


problems = []
for r in rules:
    url = r.get("annotations", {}).get("runbook_url", "")
    if not url.startswith(base) or "#" not in url:
        problems.append(f"{r['alert']}: runbook_url {url!r} is not {base}<doc>#<section>")
        continue
    doc, _, anchor = url[len(base):].partition("#")
    if not os.path.exists(f"docs/{doc}"):
        problems.append(f"{r['alert']}: runbook_url names docs/{doc}, which does not exist")
    elif anchor not in anchors(f"docs/{doc}"):
        problems.append(f"{r['alert']}: docs/{doc} has no section #{anchor}")
result(not problems, f"every alert's runbook_url names a section of the docs ({len(rules)} rules)", "\n".join(problems))
untested = sorted({r["alert"] for r in rules} - tested)
print(f"note: alerts without a unit test: {', '.join(untested) or 'none'}")

# -- The dashboard's JSON model ------------------------------------------------------------
r = subprocess.run(["python3", "scripts/gen-grafana-dashboard.py", "--check"], capture_output=True, text=True)
result(r.returncode == 0, f"{dash_path} is what scripts/gen-grafana-dashboard.py writes", r.stderr)
dash = json.load(open(dash_path))
problems = []
for key in ("uid", "title", "panels", "templating", "schemaVersion"):
    if key not in dash:
        problems.append(f"no {key}")
variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
if variables.get("datasource", {}).get("type") != "datasource" or variables["datasource"].get("query") != "prometheus":
    problems.append("no templated Prometheus datasource variable `datasource`")
ids = [p.get("id") for p in dash.get("panels", [])]
if len(ids) != len(set(ids)) or None in ids:
    problems.append("panel ids are missing or repeated")
cells = {}
exprs = []
for p in dash.get("panels", []):
    g = p.get("gridPos", {})
    x, y, w, h = (g.get(k) for k in ("x", "y", "w", "h"))
    if None in (x, y, w, h) or x < 0 or w <= 0 or h <= 0 or x + w > 24:
        problems.append(f"panel {p.get('title')!r}: gridPos {g} is outside 24 columns")
        continue
    for cx in range(x, x + w):
        for cy in range(y, y + h):
            if (cx, cy) in cells:
                problems.append(f"panel {p.get('title')!r} overlaps {cells[(cx, cy)]!r}")
                break
            cells[(cx, cy)] = p.get("title")
        else:
            continue
        break
    if p.get("type") == "row":
        continue
    if p.get("datasource", {}).get("uid") != "${datasource}":
        problems.append(f"panel {p.get('title')!r} is not on the templated datasource")
    targets = p.get("targets", [])
    refs = [t.get("refId") for t in targets]
    if not targets or len(refs) != len(set(refs)):
        problems.append(f"panel {p.get('title')!r}: no targets, or a refId repeated")
    for t in targets:
        if t.get("datasource", {}).get("uid") != "${datasource}" or not t.get("expr"):
            problems.append(f"panel {p.get('title')!r}: a target without the datasource or a query")
        else:
            exprs.append((p["title"], t["expr"]))
result(not problems, f"{dash_path}: JSON model ({len(ids)} panels, {len(exprs)} queries)", "\n".join(problems))
recording = {"groups": [{"name": "dashboard", "rules": [
    {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m")}
    for i, (_, e) in enumerate(exprs)]}]}
(tmp / "dashboard-rules.yml").write_text(yaml.safe_dump(recording))
ok, out = promtool("check", "rules", str(tmp / "dashboard-rules.yml"))
result(ok, f"every query of {dash_path} parses as PromQL", "" if ok else out)

# -- Metric names against their definitions ------------------------------------------------
source = open("shared/runtime/src/metrics.rs").read() + open("shared/runtime/src/flow.rs").read()
defined = {f"sluice_{name}" for name in re.findall(r'"([a-z][a-z0-9_]*_[a-z0-9_]*|commands)"', source)}
# The prometheus crate's process collector (unprefixed, Linux).
process = {"process_cpu_seconds_total", "process_open_fds", "process_max_fds",
           "process_virtual_memory_bytes", "process_resident_memory_bytes",
           "process_start_time_seconds", "process_threads"}
for what, texts in (("alerts.yml", [r["expr"] for r in rules]),
                    ("alerts.test.yml", [s["series"] for g in tests["tests"] for s in g.get("input_series", [])]),
                    ("the dashboard", [e for _, e in exprs])):
    used = set()
    for text in texts:
        used |= set(re.findall(r"\b(sluice_[a-z0-9_]+|process_[a-z0-9_]+)", text))
    unknown = sorted(m for m in used
                     if m not in defined | process
                     and re.sub(r"_(bucket|count|sum)$", "", m) not in defined)
    result(not unknown, f"every metric {what} reads is defined ({len(used)} names)",
           "not defined in shared/runtime/src/metrics.rs or flow.rs: " + ", ".join(unknown))

print(f"{passed} passed, {failed} failed, 0 skipped")
sys.exit(1 if failed else 0)
PYEOF

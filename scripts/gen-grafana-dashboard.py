#!/usr/bin/env python3
"""Writes deploy/grafana/dashboards/sluice.json, the Sluice Grafana dashboard (the metrics of
docs/architecture.md, "Observability").

The JSON is generated so that panels stay consistent (datasource, units, legends, layout);
edit this file and run it, do not edit the JSON by hand:

    python3 scripts/gen-grafana-dashboard.py            # write the dashboard
    python3 scripts/gen-grafana-dashboard.py --check    # exit 1 if the JSON is out of date

Labels it relies on: job="sluice" with `service` on the Sluice targets, Sluice's own
sluice_consumer_lag{group, topic, partition}, and the Kafka exporter's
kafka_consumergroup_lag{consumergroup, topic, partition}.
"""

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "deploy/grafana/dashboards/sluice.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
S = 'job="sluice"'

panels = []
next_id = 1
cursor = {"x": 0, "y": 0, "h": 0}


def row(title):
    global next_id
    if cursor["x"]:
        cursor["y"] += cursor["h"]
        cursor["x"] = 0
    panels.append(
        {
            "id": next_id,
            "type": "row",
            "title": title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": cursor["y"]},
            "panels": [],
        }
    )
    next_id += 1
    cursor["y"] += 1
    cursor["h"] = 0


def panel(title, targets, unit="short", w=8, h=8, kind="timeseries", description="",
          stack=False, thresholds=None, min_zero=True):
    global next_id
    if cursor["x"] + w > 24:
        cursor["y"] += cursor["h"]
        cursor["x"] = 0
        cursor["h"] = 0
    defaults = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": {}}
    if min_zero:
        defaults["min"] = 0
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        }
    if thresholds:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}]
            + [{"color": c, "value": v} for v, c in thresholds],
        }
        if kind == "timeseries":
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
    else:
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
    p = {
        "id": next_id,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": cursor["x"], "y": cursor["y"]},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
             "range": True}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "timeseries":
        p["options"] = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
            "orientation": "horizontal",
        }
    panels.append(p)
    next_id += 1
    cursor["x"] += w
    cursor["h"] = max(cursor["h"], h)


R = "$__rate_interval"

row("Overview")
panel("Services up", [(f'sum by (service) (up{{{S}}})', "{{service}}")], kind="stat", w=6, h=5,
      description="Scraped replicas answering, per service.",
      thresholds=None)
# The state gauges: every process that reports them reports the whole ledger (only the
# reconciler in deploy/ and k8s/), so replicas are taken once (max by), then tools are summed.
panel("STUCK now", [(f'sum(max by (tool) (sluice_commands{{{S}, status="STUCK"}}))', "STUCK")],
      kind="stat", w=6, h=5, thresholds=[(1, "red")],
      description="Commands whose outcome could not be established; each waits for a person. "
                  "The SluiceCommandsStuck alert holds while this is above 0.")
panel("Escalations (last hour)", [(f'sum(increase(sluice_escalations_total{{{S}}}[1h]))', "escalations")],
      kind="stat", w=6, h=5, thresholds=[(1, "orange")],
      description="Commands handed to a person: STUCK, NO_COMPENSATION, failed compensation.")
panel("Dead letters (last hour)", [(f'sum(increase(sluice_dead_letters_total{{{S}}}[1h]))', "dead letters")],
      kind="stat", w=6, h=5, thresholds=[(1, "orange")],
      description="Messages moved to the dlq topic because they could not be parsed or validated.")

row("State now")
panel("Unresolved commands by status",
      [(f'sum by (status) (max by (status, tool) (sluice_commands{{{S}}}))', "{{status}}")],
      unit="short", w=12, stack=True,
      description="sluice_commands: maintained at every ledger write, seeded from the ledger at start "
                  "(docs/architecture.md, \"Observability\"). Terminal commands are not held.")
panel("Oldest command by status",
      [(f'max by (status) (sluice_oldest_command_age_seconds{{{S}}})', "{{status}}")],
      unit="s", w=12,
      description="How long the oldest command in each status has been in it. BLOCKED past an hour "
                  "and UNKNOWN past its tool's horizon alert.")
panel("Unresolved commands by tool and status",
      [(f'max by (status, tool) (sluice_commands{{{S}}}) > 0', "{{tool}} {{status}}")],
      unit="short", w=12, description="Every (tool, status) pair with commands in it now.")
panel("UNKNOWN age against the tool's horizon",
      [(f'max by (tool) (sluice_oldest_command_age_seconds{{{S}, status="UNKNOWN"}}) '
        f'/ on (tool) max by (tool) (sluice_tool_unknown_horizon_seconds{{{S}}})', "{{tool}}")],
      unit="percentunit", w=12, thresholds=[(1, "red")],
      description="The oldest UNKNOWN command's age as a share of the time its tool's status checks take "
                  "(sluice_tool_unknown_horizon_seconds). Above 100%: SluiceUnknownPastHorizon.")

row("Effects")
panel("Submissions by outcome",
      [(f'sum by (outcome) (rate(sluice_effects_submitted_total{{{S}}}[{R}]))', "{{outcome}}")],
      unit="reqps", stack=True,
      description="POST /v1/effects: created (new command), replayed (same call again), drift (same key, other arguments: 409), invalid (422).")
panel("Confirmations by tool",
      [(f'sum by (tool) (rate(sluice_transitions_total{{{S}, to="CONFIRMED"}}[{R}]))', "{{tool}}")],
      unit="ops", stack=True, description="Commands reaching CONFIRMED per second.")
panel("Transitions to STUCK / FAILED",
      [(f'sum by (tool, to) (increase(sluice_transitions_total{{{S}, to=~"STUCK|FAILED|COMPENSATION_FAILED"}}[{R}]))',
        "{{tool}} → {{to}}")],
      unit="short", description="FAILED is a definite refusal by the upstream; STUCK needs a person.")
panel("All transitions",
      [(f'sum by (from, to) (rate(sluice_transitions_total{{{S}}}[{R}]))', "{{from}} → {{to}}")],
      unit="ops", w=12, description="Every stored state change, by edge of the state machine.")
panel("Producer HTTP requests",
      [(f'sum by (method, route, status) (rate(sluice_http_request_duration_seconds_count{{{S}}}[{R}]))',
        "{{method}} {{route}} {{status}}")],
      unit="reqps", w=12)
panel("Producer answer time p50 / p99 by route",
      [(f'histogram_quantile(0.50, sum by (method, route, le) (rate(sluice_http_request_duration_seconds_bucket{{{S}}}[{R}])))',
        "p50 {{method}} {{route}}"),
       (f'histogram_quantile(0.99, sum by (method, route, le) (rate(sluice_http_request_duration_seconds_bucket{{{S}}}[{R}])))',
        "p99 {{method}} {{route}}")],
      unit="s", w=12, thresholds=[(1, "orange")],
      description="Time to the answer's head, by route template. Long polls (?wait=, Prefer: wait) "
                  "take as long as they wait, up to producer.max_wait_ms.")
panel("Refused at the door",
      [(f'sum by (status) (rate(sluice_http_request_duration_seconds_count{{{S}, status=~"403|415|503"}}[{R}]))',
        "{{status}}")],
      unit="reqps", w=12,
      description="403: a browser origin not allowed (or a role); 415: a body that is not JSON; "
                  "503: the ledger, the dispatch backlog or the long-poll bound (too_many_waits).")

row("Dispatch")
panel("Dispatch latency p50 / p99 by tool",
      [(f'histogram_quantile(0.50, sum by (tool, le) (rate(sluice_dispatch_duration_seconds_bucket{{{S}}}[{R}])))', "p50 {{tool}}"),
       (f'histogram_quantile(0.99, sum by (tool, le) (rate(sluice_dispatch_duration_seconds_bucket{{{S}}}[{R}])))', "p99 {{tool}}")],
      unit="s", w=12, thresholds=[(5, "red")],
      description="Upstream call time. The alert fires at p99 > 5 s for 10 minutes.")
panel("Dispatch outcomes",
      [(f'sum by (outcome) (rate(sluice_dispatch_duration_seconds_count{{{S}}}[{R}]))', "{{outcome}}")],
      unit="ops", w=6, stack=True,
      description="committed (2xx), refused (4xx), ambiguous (timeout, reset, 408/425/429/5xx), not_sent.")
panel("Ambiguous outcomes by tool",
      [(f'sum by (tool) (rate(sluice_dispatch_duration_seconds_count{{{S}, outcome="ambiguous"}}[{R}])) '
        f'/ sum by (tool) (rate(sluice_dispatch_duration_seconds_count{{{S}}}[{R}]))', "{{tool}}")],
      unit="percentunit", w=6, thresholds=[(0.05, "red")],
      description="Share of calls whose outcome is unknown and goes to reconciliation. Alert above 5%.")

panel("Partition hold time p50 / p99 by topic",
      [(f'histogram_quantile(0.50, sum by (topic, le) (rate(sluice_handle_duration_seconds_bucket{{{S}}}[{R}])))', "p50 {{topic}}"),
       (f'histogram_quantile(0.99, sum by (topic, le) (rate(sluice_handle_duration_seconds_bucket{{{S}}}[{R}])))', "p99 {{topic}}")],
      unit="s", w=24,
      description="How long each consumed message holds its partition, from hand-out to acknowledgement "
                  "(ledger writes, the call, publishing the next message, retries). A partition takes its "
                  "next message only then, so a stage's rate is at most its partitions over this time.")

row("Reconciliation and pipeline health")
panel("Sweep items by status",
      [(f'sum by (status) (rate(sluice_sweep_items_total{{{S}}}[{R}]))', "{{status}}")],
      unit="ops", stack=True,
      description="LEASED: expired leases found; PENDING: stale commands republished; SCHEDULED: due commands.")
panel("Dead letters by topic",
      [(f'sum by (topic) (increase(sluice_dead_letters_total{{{S}}}[{R}]))', "{{topic}}")],
      unit="short")
panel("CAS conflicts",
      [(f'sum by (service) (rate(sluice_cas_conflicts_total{{{S}}}[{R}]))', "{{service}}"),
       (f'sum(rate(sluice_cas_conflicts_total{{{S}}}[{R}])) / sum(rate(sluice_transitions_total{{{S}}}[{R}]))',
        "share of transitions")],
      unit="short",
      description="Guarded ledger writes that found the command changed (duplicates, zombies, rebalances).")

row("Ledger")
panel("Ledger round trips by op and kind",
      [(f'sum by (op, kind) (rate(sluice_ledger_round_trips_total{{{S}}}[{R}]))', "{{op}} {{kind}}")],
      unit="ops", w=12, stack=True,
      description="kind: lwt (a Paxos round), serial (a SERIAL read settling a timed-out LWT), plain.")
panel("Ledger latency by op and kind (mean)",
      [(f'sum by (op, kind) (rate(sluice_ledger_round_trip_seconds_total{{{S}}}[{R}])) '
        f'/ sum by (op, kind) (rate(sluice_ledger_round_trips_total{{{S}}}[{R}]))', "{{op}} {{kind}}")],
      unit="s", w=12,
      description="Time waiting for the store's answer per round trip. A slow store shows here first; "
                  "a slow stage with a fast store waits elsewhere (the bus, the upstream).")
panel("LWTs per confirmed effect",
      [(f'sum(rate(sluice_ledger_round_trips_total{{{S}, kind="lwt"}}[5m])) '
        f'/ sum(rate(sluice_transitions_total{{{S}, to="CONFIRMED"}}[5m]))', "LWT / confirmed")],
      unit="short", w=12, thresholds=[(3.5, "red")],
      description="Expected 3 (4 with a business key). Alert above 3.5 for 30 minutes: a ledger cost regression.")

row("Processes")
panel("CPU by service",
      [(f'sum by (service) (rate(process_cpu_seconds_total{{{S}}}[{R}]))', "{{service}}")],
      unit="percentunit", w=8, description="Cores used by each service's processes.")
panel("Resident memory by instance",
      [(f'max by (service, instance) (process_resident_memory_bytes{{{S}}})', "{{service}} {{instance}}")],
      unit="bytes", w=8)
panel("Open file descriptors by instance",
      [(f'max by (service, instance) (process_open_fds{{{S}}})', "{{service}} {{instance}}")],
      unit="short", w=8, description="Sockets included: long polls and event streams each hold one.")
panel("Builds running",
      [(f'count by (version, revision) (sluice_build_info{{{S}}})', "{{version}} {{revision}}")],
      kind="stat", w=24, h=4, description="Processes per build (sluice_build_info): more than one during a rollout.")

row("Kafka")
panel("Consumer lag by group",
      [('sum by (consumergroup) (kafka_consumergroup_lag{consumergroup=~"sluice-.*"})', "{{consumergroup}}")],
      unit="short", w=12, thresholds=[(1000, "red")],
      description="From the Kafka exporter. Drives the autoscalers; alert above 1000 for 10 minutes.")
panel("Consumer lag by topic and partition",
      [('sum by (consumergroup, topic, partition) (kafka_consumergroup_lag{consumergroup=~"sluice-.*"})',
        "{{consumergroup}} {{topic}}/{{partition}}")],
      unit="short", w=12,
      description="A single hot partition means one run (or a few) carries most of the load.")
panel("Consumer lag by group (Sluice)",
      [(f'sum by (group) (max by (group, topic, partition) (sluice_consumer_lag{{{S}}}))', "{{group}}")],
      unit="short", w=12, thresholds=[(1000, "red")],
      description="Sluice's own reading (sluice_consumer_lag, every 5 s by each consuming service; "
                  "the max over its replicas), with or without the Kafka exporter: the embedded bus too.")
panel("Consumer lag by partition (Sluice)",
      [(f'max by (group, topic, partition) (sluice_consumer_lag{{{S}}})',
        "{{group}} {{topic}}/{{partition}}")],
      unit="short", w=12, thresholds=[(500, "red")],
      description="One partition behind alone: a message held by its retries, or the member "
                  "holding the partition. Alert (SluicePartitionLagHigh) above 500 for 10 minutes.")

dashboard = {
    "uid": "sluice-overview",
    "title": "Sluice",
    "description": "Sluice outbox pipeline: effects, dispatch, reconciliation, ledger cost, consumer lag.",
    "tags": ["sluice"],
    "timezone": "utc",
    "editable": False,
    "graphTooltip": 1,
    "refresh": "30s",
    "schemaVersion": 39,
    "version": 1,
    "time": {"from": "now-3h", "to": "now"},
    "templating": {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "includeAll": False,
                "multi": False,
            }
        ]
    },
    "annotations": {"list": []},
    "links": [],
    "panels": panels,
}

text = json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"
if "--check" in sys.argv[1:]:
    if not OUT.exists() or OUT.read_text() != text:
        print(f"{OUT.relative_to(OUT.parents[3])}: out of date; run python3 scripts/gen-grafana-dashboard.py", file=sys.stderr)
        sys.exit(1)
else:
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(OUT.parents[3])} ({len(panels)} panels)")

#!/usr/bin/env python3
"""The public event contract, end to end (scripts/suites/events-contract.sh).

1. schemas/asyncapi.yaml parses and validates with the AsyncAPI parser (npm @asyncapi/parser),
   its payloads resolved from schemas/events/; the generated files are up to date.
2. A real Sluice (`$SLUICE_BIN dev` with the Kafka bus on the engines' broker and a SQLite
   ledger) and its demo upstream (`$SLUICE_BIN upstream`) settle one wire CONFIRMED and, with
   the bank answering 500 after committing and its status checks 503, one wire STUCK. A copy of
   the CONFIRMED event is published again, as an at-least-once delivery may bring it.
3. The two consumer examples (examples/consumers: Python with confluent-kafka, TypeScript with
   kafkajs) each read the topic in a group of their own: each must handle the CONFIRMED and
   the STUCK event once, validated against their schemas, and ignore the duplicate.

Prints one line per check and ends with "N passed, N failed, N skipped". The consumer checks
are skipped, saying why, with SLUICE_SKIP_KAFKA=1.

Arguments: the Python to run the Python example with, the TypeScript example's built
directory, and the AsyncAPI validator's directory (what the suite installed).
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
results = {"passed": 0, "failed": 0, "skipped": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""), flush=True)
    return ok


def skip(name, why):
    results["skipped"] += 1
    print(f"skip {name}: {why}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=40):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"content-type": "application/json"} if body is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def wait_until(what, probe, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within {seconds} s")


def contract_checks(validator_dir):
    out = subprocess.run(["node", str(Path(validator_dir) / "validate-asyncapi.mjs"), str(ROOT)],
                         capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        check("the AsyncAPI validator ran", False, out.stderr[-2000:])
    for line in lines:
        check(line["check"], line["ok"], line["detail"])
    generated = subprocess.run([sys.executable, str(ROOT / "scripts/gen-event-schemas.py"), "--check"],
                               capture_output=True, text=True)
    check("schemas/events and schemas/asyncapi.yaml are what scripts/gen-event-schemas.py writes",
          generated.returncode == 0, generated.stdout + generated.stderr)


def catalog_text(upstream):
    """The example catalog, its wire publishing `amount_minor` with its events and giving up
    after one inconclusive status check (so a wire goes STUCK in seconds)."""
    text = (ROOT / "deploy/catalog.toml").read_text().replace("http://127.0.0.1:8787", upstream)
    # The wire is the first tool: its [tool.policy] is the first one.
    text = text.replace("[tool.policy]", '[tool.events]\ninclude_args = ["amount_minor"]\n\n[tool.policy]', 1)
    text, n = re.subn(r"(?m)^max_checks = \d+", "max_checks = 1", text, count=1)
    assert n == 1, "the wire's max_checks"
    text, n = re.subn(r"(?m)^settle_ms = \d+", "settle_ms = 300", text, count=1)
    assert n == 1, "the wire's settle_ms"
    return text


def run_sluice(workdir, brokers, prefix, events_checks):
    sluice = os.environ["SLUICE_BIN"]
    upstream_port, api_port = free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    (workdir / "catalog.toml").write_text(catalog_text(upstream_url))
    (workdir / "sluice.toml").write_text(f"""
[catalog]
path = {json.dumps(str(workdir / 'catalog.toml'))}
[ledger]
kind = "sqlite"
data_dir = {json.dumps(str(workdir / 'data'))}
[bus]
kind = "kafka"
topic_prefix = {json.dumps(prefix)}
partitions = 2
[bus.kafka]
brokers = {json.dumps(brokers)}
replication_factor = 1
[producer]
listen = "127.0.0.1:{api_port}"
open = true
""")
    env = {**os.environ, "SLUICE_CONFIG": "", "RUST_LOG": "warn"}
    env.pop("SLUICE_CONFIG")
    logs = open(workdir / "services.log", "w")
    processes = []
    try:
        processes.append(subprocess.Popen([sluice, "upstream", "--listen", f"127.0.0.1:{upstream_port}"],
                                          stdout=logs, stderr=logs, env=env))
        migrate = subprocess.run([sluice, "migrate", "--config", str(workdir / "sluice.toml")],
                                 capture_output=True, text=True, env=env, timeout=120)
        if migrate.returncode != 0:
            raise RuntimeError(f"sluice migrate: {migrate.stderr[-2000:]}")
        processes.append(subprocess.Popen([sluice, "dev", "--config", str(workdir / "sluice.toml")],
                                          stdout=logs, stderr=logs, env=env))
        api = f"http://127.0.0.1:{api_port}"
        wait_until("the API answers", lambda: _ok(f"{api}/readyz"), 60)
        wait_until("the upstream answers", lambda: _ok(f"{upstream_url}/_faults"), 30)
        trace_id = uuid.uuid4().hex
        traceparent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
        runs = {"confirmed": f"r-ec-ok-{uuid.uuid4().hex[:8]}", "stuck": f"r-ec-stuck-{uuid.uuid4().hex[:8]}"}
        wire = lambda run, amount: {  # noqa: E731
            "run_id": run, "decision": 1, "tool": "payments/wire", "call_idx": 0,
            "args": {"account": "acc-ec", "amount_minor": amount, "beneficiary": f"b-{run}",
                     "date": "2026-11-22", "reference": "invoice 7 for Jane Doe"}}
        status, answer = http("POST", f"{api}/v1/effects", wire(runs["confirmed"], 4200),
                              {"prefer": "wait=30", "traceparent": traceparent})
        events_checks["confirmed wire"] = (status, answer)
        http("POST", f"{upstream_url}/_faults", {"bank": {"commit_then_5xx": 1.0}, "status_inconclusive": 1.0})
        http("POST", f"{api}/v1/effects", wire(runs["stuck"], 4300))
        key = "d-1%2Fpayments%2Fwire%2F0"
        stuck = wait_until("the second wire is STUCK", lambda: _status(
            f"{api}/v1/runs/{runs['stuck']}/effects/{key}?wait=10s", "STUCK"), 90)
        events_checks["stuck wire"] = stuck
        http("POST", f"{upstream_url}/_faults", {})
        return runs, trace_id, processes, logs
    except BaseException:
        stop(processes, logs)
        raise


def _ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _status(url, wanted):
    status, answer = http("GET", url, timeout=20)
    return answer if status == 200 and answer.get("status") == wanted else None


def stop(processes, logs):
    for process in reversed(processes):
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
    logs.close()


def publish_duplicate(python, brokers, topic, run_id):
    """Publishes a copy of the run's CONFIRMED event (same key, headers and payload): what an
    at-least-once delivery may bring a consumer."""
    script = r"""
import sys
from confluent_kafka import Consumer, Producer
brokers, topic, run = sys.argv[1:4]
consumer = Consumer({"bootstrap.servers": brokers, "group.id": "events-contract-copier-" + run,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
consumer.subscribe([topic])
found = None
for _ in range(120):
    message = consumer.poll(0.5)
    if message is None or message.error():
        continue
    headers = dict((k, v) for k, v in (message.headers() or []))
    if message.key() == run.encode() and headers.get("ce_type") == b"dev.sluice.effect.confirmed.v1":
        found = message
        break
consumer.close()
if found is None:
    sys.exit("no CONFIRMED event of " + run)
producer = Producer({"bootstrap.servers": brokers})
producer.produce(topic, key=found.key(), value=found.value(), headers=found.headers())
producer.flush(10)
print(dict(found.headers())["ce_id"].decode())
"""
    out = subprocess.run([python, "-c", script, brokers, topic, run_id], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"copying the CONFIRMED event: {out.stderr[-2000:]}")
    return out.stdout.strip()


def consumer_checks(name, command, runs, trace_id, duplicate_id):
    out = subprocess.run(command, capture_output=True, text=True, timeout=180)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ours = set(runs.values())
    handled = [line for line in lines if "handled" in line and line["event"]["run_id"] in ours]
    kinds = sorted(line["handled"] for line in handled)
    if not check(f"{name}: handles the CONFIRMED and the STUCK event once each",
                 out.returncode == 0 and kinds == ["dev.sluice.effect.confirmed.v1", "dev.sluice.effect.stuck.v1"],
                 f"exit {out.returncode}, handled {kinds}; stderr: {out.stderr[-1500:]}"):
        return
    duplicates = [line for line in lines if line.get("duplicate") == duplicate_id]
    check(f"{name}: ignores the duplicate delivery (the same ce_id)", len(duplicates) == 1, f"{lines}")
    confirmed = next(line for line in handled if line["handled"].endswith("confirmed.v1"))
    stuck = next(line for line in handled if line["handled"].endswith("stuck.v1"))
    event = confirmed["event"]
    check(f"{name}: the CONFIRMED payload is the projection, with the opted-in argument only",
          event["run_id"] == runs["confirmed"] and confirmed["key"] == runs["confirmed"]
          and event["status"] == "CONFIRMED" and event["args"] == {"amount_minor": 4200}
          and event["outcome"]["decided_by"] == "call" and event.get("external_ref")
          and not {"lease", "result", "args_hash", "policy_version"} & set(event),
          json.dumps(event))
    check(f"{name}: the event carries the submission's W3C traceparent",
          (confirmed.get("traceparent") or "").split("-")[1:2] == [trace_id], str(confirmed.get("traceparent")))
    check(f"{name}: the STUCK payload names its run and why",
          stuck["event"]["run_id"] == runs["stuck"] and stuck["event"]["status"] == "STUCK"
          and stuck["event"]["escalated"] is True and stuck["event"]["outcome"]["ambiguous"] is True,
          json.dumps(stuck["event"]))


def main():
    python, ts_dist, validator_dir = sys.argv[1:4]
    contract_checks(validator_dir)
    consumer_names = ["python consumer (confluent-kafka)", "typescript consumer (kafkajs)"]
    if os.environ.get("SLUICE_SKIP_KAFKA") == "1":
        for name in consumer_names:
            skip(name, "SLUICE_SKIP_KAFKA=1: no Kafka to run Sluice and the consumers against")
    else:
        brokers = os.environ.get("SLUICE_TEST_KAFKA_BROKERS", "127.0.0.1:19092")
        prefix = f"sluice-ec-{uuid.uuid4().hex[:8]}."
        topic = f"{prefix}events"
        with tempfile.TemporaryDirectory(prefix="sluice-events-contract-") as tmp:
            workdir = Path(tmp)
            seen = {}
            try:
                runs, trace_id, processes, logs = run_sluice(workdir, brokers, prefix, seen)
            except Exception as error:  # noqa: BLE001 - reported as a failed check
                log = (workdir / "services.log")
                check("a real Sluice on Kafka settles one wire CONFIRMED and one STUCK", False,
                      f"{error}; log tail: {log.read_text()[-3000:] if log.exists() else ''}")
                return
            try:
                status, answer = seen["confirmed wire"]
                check("a real Sluice on Kafka settles one wire CONFIRMED and one STUCK",
                      status in (200, 201) and answer.get("status") == "CONFIRMED"
                      and seen["stuck wire"]["status"] == "STUCK", f"{status} {answer}")
                duplicate = publish_duplicate(python, brokers, topic, runs["confirmed"])
                common = ["--bootstrap", brokers, "--topic", topic, "--idle-exit", "6",
                          "--schemas", str(ROOT / "schemas/events")]
                consumer_checks(consumer_names[0],
                                [python, str(ROOT / "examples/consumers/python/consumer.py"),
                                 "--group", f"ec-python-{uuid.uuid4().hex[:6]}", *common],
                                runs, trace_id, duplicate)
                consumer_checks(consumer_names[1],
                                ["node", str(Path(ts_dist) / "consumer.js"),
                                 "--group", f"ec-typescript-{uuid.uuid4().hex[:6]}", *common],
                                runs, trace_id, duplicate)
            finally:
                stop(processes, logs)


if __name__ == "__main__":
    try:
        main()
    finally:
        print(f"{results['passed']} passed, {results['failed']} failed, {results['skipped']} skipped")
    sys.exit(1 if results["failed"] else 0)

#!/usr/bin/env python3
"""React to Sluice's CONFIRMED and STUCK effects, read from the events topic.

A stream consumer of Sluice's public event contract (docs/events.md): it subscribes to
`<prefix>events` in a consumer group of its own, takes `dev.sluice.effect.confirmed.v1` and
`dev.sluice.effect.stuck.v1`, validates each payload against the JSON Schema its
`ce_dataschema` names (schemas/events/), and ignores every other type. Delivery is at least
once, so it deduplicates by `ce_id` before acting; offsets are committed only after an event
was handled, so a crash redelivers rather than loses.

    pip install -r requirements.txt
    python consumer.py --bootstrap 127.0.0.1:9092 --topic sluice.events --group billing

Each handled event is printed as one JSON line ({"handled": ...}); a duplicate as
{"duplicate": ...}. A real consumer keeps the ids it handled in its own store (a table with a
unique key, written in the same transaction as its side effect) for at least as long as
Sluice may publish an event again; the in-memory set here only lasts the process.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError
from jsonschema import Draft202012Validator, FormatChecker

REPO = Path(__file__).resolve().parents[3]
CONFIRMED = "dev.sluice.effect.confirmed.v1"
STUCK = "dev.sluice.effect.stuck.v1"


def on_confirmed(event):
    """The effect committed: e.g. mark the order paid, with the upstream's reference."""
    return {"run_id": event["run_id"], "command_key": event["command_key"],
            "external_ref": event.get("external_ref"), "decided_by": event["outcome"].get("decided_by")}


def on_stuck(event):
    """Nobody could establish the outcome: e.g. open a ticket for a person."""
    return {"run_id": event["run_id"], "command_key": event["command_key"],
            "last_error": event.get("last_error")}


HANDLERS = {CONFIRMED: on_confirmed, STUCK: on_stuck}


def validators(schema_dir):
    """One validator per published schema, by its URL ($id): what ce_dataschema names."""
    out = {}
    for path in sorted(Path(schema_dir).glob("*.json")):
        schema = json.loads(path.read_text())
        out[schema["$id"]] = Draft202012Validator(schema, format_checker=FormatChecker())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="sluice.events")
    parser.add_argument("--group", default="example-python-consumer")
    parser.add_argument("--schemas", default=str(REPO / "schemas/events"))
    parser.add_argument("--idle-exit", type=float, default=0,
                        help="stop after this many seconds without a message (0: run until stopped)")
    args = parser.parse_args()

    schemas = validators(args.schemas)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    handled_ids = set()
    last_message = time.monotonic()
    try:
        while not args.idle_exit or time.monotonic() - last_message < args.idle_exit:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    print(json.dumps({"error": str(message.error())}), file=sys.stderr)
                continue
            last_message = time.monotonic()
            headers = {k: v.decode() for k, v in (message.headers() or []) if v is not None}
            kind, event_id = headers.get("ce_type"), headers.get("ce_id")
            handler = HANDLERS.get(kind)
            if handler is None:
                consumer.commit(message=message, asynchronous=False)  # a type it does not act on
                continue
            if event_id in handled_ids:
                print(json.dumps({"duplicate": event_id, "type": kind}), flush=True)
                consumer.commit(message=message, asynchronous=False)
                continue
            event = json.loads(message.value())
            validator = schemas.get(headers.get("ce_dataschema"))
            if validator is None:
                raise SystemExit(f"no published schema for {headers.get('ce_dataschema')!r}")
            validator.validate(event)  # raises, naming the field, on a payload off its contract
            result = handler(event)
            handled_ids.add(event_id)
            print(json.dumps({"handled": kind, "id": event_id, "key": message.key().decode(),
                              "traceparent": headers.get("traceparent"), "event": event, **result}),
                  flush=True)
            consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()

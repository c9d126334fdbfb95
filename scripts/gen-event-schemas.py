#!/usr/bin/env python3
"""Writes schemas/events/<type>.json, the JSON Schema (draft 2020-12) of every public event type
(docs/events.md), each self-contained so a consumer validates with one file, and
schemas/asyncapi.yaml, the AsyncAPI 3.0 document of the events topic and the webhook deliveries
that references them (checked by @asyncapi/parser in scripts/suites/events-contract.sh).

The payloads are built by sluice_core::events (EffectEvent, FlowEvent); this file describes
them, and shared/runtime/tests/schemas.rs checks that what Sluice emits validates, and that no
schema breaks its released copy under schemas/events/released/ (the compatibility rule).
Edit this file and run it, do not edit the JSON by hand:

    python3 scripts/gen-event-schemas.py            # write the schemas and the AsyncAPI document
    python3 scripts/gen-event-schemas.py --check    # exit 1 if one is out of date

A new type (or a new version of one) gets its released copy when it ships:

    cp schemas/events/<type>.json schemas/events/released/
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "schemas/events"
BASE = "https://sluice.dev/schemas/events/"

# Every status a command has (sluice_core::command::CommandStatus), as the payload spells it.
STATUSES = [
    "SCHEDULED", "PENDING", "BLOCKED", "APPROVED", "LEASED", "CONFIRMED", "FAILED", "UNKNOWN",
    "STUCK", "CANCELLED", "COMPENSATING", "COMPENSATED", "COMPENSATION_FAILED", "NO_COMPENSATION",
]
# The statuses whose event is published (sluice_core::events::PUBLISHED).
PUBLISHED = [
    "CONFIRMED", "FAILED", "STUCK", "BLOCKED", "CANCELLED", "COMPENSATED", "COMPENSATION_FAILED",
    "NO_COMPENSATION",
]
FLOW_CHANGES = ["paused", "resumed", "breaker_opened", "breaker_half_open", "breaker_closed"]

WHAT = {
    "CONFIRMED": "the effect committed upstream (by the call's answer, a status check, or a person's resolution)",
    "FAILED": "the effect did not commit and will not be tried again (refused, denied by policy, found absent, or resolved so by a person)",
    "STUCK": "the outcome could not be established from evidence: a person must resolve it",
    "BLOCKED": "the policy requires a person's approval before the call",
    "CANCELLED": "the effect was cancelled before it committed (by a person, a rejection, an approval that never came, or a rollback that found it unsent)",
    "COMPENSATED": "a committed effect was undone by the tool's compensate call",
    "COMPENSATION_FAILED": "the undo of a committed effect failed or was refused: a person must act",
    "NO_COMPENSATION": "a committed effect must be undone but the tool declares no compensate: a person must act",
}

TIME = {"type": "string", "format": "date-time"}


def text(description, **more):
    return {"type": "string", "description": description, **more}


def count(description):
    return {"type": "integer", "minimum": 0, "description": description}


def effect_schema(kind, status_rule, description):
    properties = {
        "run_id": text("The agent run the effect belongs to; the Kafka message key.",
                       pattern="^[A-Za-z0-9._:-]{1,128}$"),
        "command_key": text("The effect's key within the run: d-<decision>/<namespace>/<tool>/<call index>."),
        "tool": text("The tool, as <namespace>/<name>."),
        "status": {"type": "string", "description": "The command's status when the event was published.", **status_rule},
        "tenant": text("The tenant the effect counts against."),
        "submitted_by": text("The API token (principal) that submitted the effect; absent when submitted without authentication."),
        "idempotency_key": text("The key the upstream saw: <run_id>/<command_key>."),
        "business_key": text("The tool's business key of the effect, when it declares one."),
        "external_ref": text("The upstream's reference of the effect (a payment id, a message id), when known."),
        "outcome": {
            "type": "object",
            "description": "How the outcome was reached.",
            "required": ["attempts", "checks", "replays", "ambiguous", "verification_pending", "duplicates_owed"],
            "properties": {
                "decided_by": {
                    "type": "string",
                    "enum": ["call", "lookup", "verification", "person", "policy", "approval_timeout", "compensation"],
                    "description": "What brought the command to a final status; absent for STUCK and BLOCKED. Values may be added within v1: read an unknown one as 'other'.",
                },
                "observation": {
                    "type": "string",
                    "enum": ["present", "absent", "duplicate"],
                    "description": "What the status check found, when one decided it.",
                },
                "attempts": count("Calls made in the current cycle."),
                "checks": count("Status checks made while the outcome was unknown, in the current cycle."),
                "replays": count("Operator replays so far."),
                "ambiguous": {"type": "boolean", "description": "An attempt's outcome was once unknown."},
                "verification_pending": {"type": "boolean", "description": "A last look at the upstream is still owed."},
                "duplicates_owed": count("Extra commits found by a status check, still to be undone."),
            },
            "additionalProperties": True,
        },
        "escalated": {"type": "boolean", "description": "Handed to a person."},
        "escalation_reason": text("Why it was handed to a person (on dev.sluice.effect.escalated.v1); at most 512 bytes."),
        "last_error": text("The last error recorded (never a secret); at most 512 bytes."),
        "approval": {
            "type": "object",
            "description": "The approval of a command that needed one (who approved is not published).",
            "required": ["at", "policy_version"],
            "properties": {"at": TIME, "policy_version": {"type": "string"}},
            "additionalProperties": True,
        },
        "compensation": {
            "type": "object",
            "description": "The undo's progress.",
            "required": ["started_at", "attempts"],
            "properties": {
                "started_at": TIME,
                "ended_at": TIME,
                "reference": text("The upstream's reference of the undo."),
                "attempts": count("Compensate calls made."),
            },
            "additionalProperties": True,
        },
        "submitted_at": {**TIME, "description": "When the effect was submitted."},
        "updated_at": {**TIME, "description": "When the command reached this state."},
        "args": {
            "type": "object",
            "description": "Only the arguments the tool opts in ([tool.events] include_args); absent otherwise.",
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{BASE}{kind}.json",
        "title": kind,
        "description": description
        + " Published on the <prefix>events topic keyed by run_id, in CloudEvents binary mode"
        " (docs/events.md, schemas/asyncapi.yaml). A consumer ignores fields it does not know.",
        "type": "object",
        "required": ["run_id", "command_key", "tool", "status", "tenant", "idempotency_key",
                     "outcome", "escalated", "submitted_at", "updated_at"],
        "properties": properties,
        "additionalProperties": True,
    }


def flow_schema(kind, change):
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{BASE}{kind}.json",
        "title": kind,
        "description": f"A flow control changed ({change}): a tool's or upstream's pause and circuit"
        " breaker after the change. Published on the <prefix>events topic keyed by the tool or"
        " upstream name (docs/events.md). A consumer ignores fields it does not know.",
        "type": "object",
        "required": ["name", "change", "breaker"],
        "properties": {
            "name": text("The tool (<namespace>/<name>) or upstream."),
            "change": {"type": "string", "const": change},
            "pause": {
                "type": "object",
                "description": "The operator's pause, while paused.",
                "required": ["actor", "reason", "at"],
                "properties": {"actor": {"type": "string"}, "reason": {"type": "string"}, "at": TIME},
                "additionalProperties": True,
            },
            "breaker": {
                "type": "object",
                "required": ["state"],
                "properties": {
                    "state": {"type": "string", "enum": ["closed", "open", "half_open"]},
                    "since": TIME,
                    "probe_at": {**TIME, "description": "When an open breaker lets its probe go."},
                    "opened": count("How many times in a row it opened."),
                    "reason": {"type": "string"},
                },
                "additionalProperties": True,
            },
        },
        "additionalProperties": True,
    }


def schemas():
    out = {}
    for status in PUBLISHED:
        kind = f"dev.sluice.effect.{status.lower()}.v1"
        out[kind] = effect_schema(kind, {"const": status}, f"A command reached {status}: {WHAT[status]}.")
    kind = "dev.sluice.effect.escalated.v1"
    out[kind] = effect_schema(
        kind,
        {"enum": STATUSES},
        "A command was handed to a person (escalation_reason says why), beside its status's own"
        " event: STUCK, NO_COMPENSATION, a failed compensation, an extra commit left standing on"
        " a CONFIRMED command, an approval that never came.",
    )
    for change in FLOW_CHANGES:
        kind = f"dev.sluice.flow.{change}.v1"
        out[kind] = flow_schema(kind, change)
    return out


CE_HEADERS = {
    "ce_specversion": ("CloudEvents spec version: 1.0.", {"const": "1.0"}),
    "ce_id": ("The event's id, derived from the transition (run, key, type name, time, epoch): the same event published twice has the same id. Deduplicate by it.", {}),
    "ce_source": ("/sluice/<service> that published it.", {}),
    "ce_type": ("The versioned type, e.g. dev.sluice.effect.confirmed.v1.", {}),
    "ce_dataschema": ("The URL ($id) of the type's JSON Schema.", {"format": "uri"}),
    "ce_subject": ("<run_id>/<command_key> (flow events: the tool or upstream).", {}),
    "ce_time": ("When it was published (RFC 3339).", {"format": "date-time"}),
    "ce_reason": ("dev.sluice.effect.escalated.v1 only: why a person must act.", {}),
    "ce_traceparent": ("CloudEvents distributed-tracing extension: the effect's W3C trace context.", {}),
    "ce_tracestate": ("CloudEvents distributed-tracing extension: W3C tracestate.", {}),
    "traceparent": ("W3C trace context, as OpenTelemetry's Kafka instrumentations read it.", {}),
    "tracestate": ("W3C tracestate.", {}),
    "content-type": ("application/json.", {"const": "application/json"}),
    "sluice-format": ("Sluice's message format (decimal); readers ignore what they do not know.", {}),
}
KAFKA_REQUIRED = ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_dataschema", "ce_subject", "ce_time", "content-type"]
WEBHOOK_HEADERS = {
    "webhook-id": ("Standard Webhooks: the event's id (the same as ce-id); deduplicate by it.", {}),
    "webhook-timestamp": ("Standard Webhooks: seconds since the epoch when the request was signed.", {"pattern": "^[0-9]+$"}),
    "webhook-signature": ("Standard Webhooks: v1,<base64 HMAC-SHA256 of id.timestamp.body> under the subscription's whsec_ key; verify it and the timestamp's age before reading.", {"pattern": "^v1,"}),
    "ce-specversion": ("CloudEvents HTTP binding, binary mode.", {"const": "1.0"}),
    "ce-id": ("The event's id.", {}),
    "ce-source": ("/sluice/<service>.", {}),
    "ce-type": ("The versioned type.", {}),
    "ce-dataschema": ("The URL of the type's JSON Schema.", {}),
    "ce-subject": ("<run_id>/<command_key>.", {}),
    "ce-time": ("RFC 3339.", {}),
    "ce-reason": ("Escalations only.", {}),
    "ce-traceparent": ("The effect's W3C trace context.", {}),
    "content-type": ("application/json.", {}),
}
WEBHOOK_REQUIRED = ["webhook-id", "webhook-timestamp", "webhook-signature", "ce-specversion", "ce-id", "ce-type", "ce-source"]


def header_schema(headers, required):
    return {
        "type": "object",
        "required": required,
        "properties": {name: {"type": "string", "description": d, **more} for name, (d, more) in headers.items()},
    }


def message_name(kind):
    parts = kind.split(".")  # dev sluice effect confirmed v1
    words = [parts[2]] + parts[3].split("_") + [parts[4]]
    return words[0] + "".join(w.capitalize() for w in words[1:])


def asyncapi():
    kinds = list(schemas())
    messages, webhook_messages, channel_messages, webhook_channel_messages = {}, {}, {}, {}
    for kind in kinds:
        name = message_name(kind)
        payload = {"schemaFormat": "application/schema+json;version=draft-07", "schema": {"$ref": f"./events/{kind}.json"}}
        common = {
            "name": kind,
            "title": kind,
            "summary": schemas()[kind]["description"].split(" Published on")[0],
            "contentType": "application/json",
            "payload": payload,
        }
        messages[name] = {
            **common,
            "traits": [{"$ref": "#/components/messageTraits/kafkaCloudEvent"}],
            "bindings": {"kafka": {
                "key": {"type": "string", "description": "The run id (flow events: the tool or upstream name): a run's events are in order on one partition."},
                "bindingVersion": "0.5.0",
            }},
        }
        webhook_messages[f"{name}Webhook"] = {
            **common,
            "traits": [{"$ref": "#/components/messageTraits/webhookCloudEvent"}],
        }
        channel_messages[name] = {"$ref": f"#/components/messages/{name}"}
        webhook_channel_messages[f"{name}Webhook"] = {"$ref": f"#/components/messages/{name}Webhook"}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Sluice public events",
            "version": "1.0.0",
            "description": "The lifecycle events of Sluice's effects and flow controls, for stream"
            " consumers and webhook receivers: what docs/events.md describes. Each payload is a"
            " documented projection of the effect (never the stored record: no arguments unless"
            " the tool opts some in, no secrets, no upstream answer), typed per transition and"
            " version. Generated by scripts/gen-event-schemas.py.",
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "kafka": {
                "host": "{bootstrap}",
                "protocol": "kafka",
                "description": "The install's Kafka (bus.kafka.brokers).",
                "variables": {"bootstrap": {"default": "127.0.0.1:9092"}},
            },
            "webhookReceiver": {
                "host": "{host}",
                "protocol": "https",
                "description": "A receiver of a [[webhooks]] subscription (its url).",
                "variables": {"host": {"default": "hooks.example.com"}},
            },
        },
        "channels": {
            "events": {
                "address": "{prefix}events",
                "title": "The events topic",
                "description": "One message per transition worth telling, keyed by run id,"
                " CloudEvents 1.0 in Kafka binary mode: the attributes are ce_ headers. Delivery is"
                " at least once: deduplicate by ce_id. Ignore types you do not know.",
                "parameters": {"prefix": {"description": "bus.topic_prefix (default sluice.).", "default": "sluice."}},
                "servers": [{"$ref": "#/servers/kafka"}],
                "messages": channel_messages,
                "bindings": {"kafka": {"topic": "sluice.events", "bindingVersion": "0.5.0"}},
            },
            "webhook": {
                "address": "{path}",
                "title": "A webhook delivery",
                "description": "One signed POST per event a subscription's types take (Standard"
                " Webhooks signature, CloudEvents HTTP binary mode), retried with backoff until a"
                " 2xx; the same event is delivered once per subscription (webhook-id).",
                "parameters": {"path": {"description": "The subscription url's path.", "default": "/sluice"}},
                "servers": [{"$ref": "#/servers/webhookReceiver"}],
                "messages": webhook_channel_messages,
            },
        },
        "operations": {
            "publishEvents": {
                "action": "send",
                "title": "Sluice publishes lifecycle and flow-control events",
                "channel": {"$ref": "#/channels/events"},
                "messages": [{"$ref": f"#/channels/events/messages/{m}"} for m in channel_messages],
            },
            "deliverWebhooks": {
                "action": "send",
                "title": "Sluice posts the events a subscription takes to its receiver",
                "channel": {"$ref": "#/channels/webhook"},
                "bindings": {"http": {"method": "POST", "bindingVersion": "0.3.0"}},
                "messages": [{"$ref": f"#/channels/webhook/messages/{m}"} for m in webhook_channel_messages],
            },
        },
        "components": {
            "messageTraits": {
                "kafkaCloudEvent": {
                    "headers": header_schema(CE_HEADERS, KAFKA_REQUIRED),
                },
                "webhookCloudEvent": {
                    "headers": header_schema(WEBHOOK_HEADERS, WEBHOOK_REQUIRED),
                    "bindings": {"http": {"headers": header_schema(WEBHOOK_HEADERS, WEBHOOK_REQUIRED), "bindingVersion": "0.3.0"}},
                },
            },
            "messages": {**messages, **webhook_messages},
        },
    }


def yaml(value, indent=0):
    """A small YAML writer: block mappings and sequences, every scalar in JSON syntax (valid YAML)."""
    pad = "  " * indent
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            key_text = key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key_text}:")
                out.append(yaml(item, indent + 1))
            else:
                out.append(f"{pad}{key_text}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                body = yaml(item, indent + 1).lstrip()
                out.append(f"{pad}- {body}")
            else:
                out.append(f"{pad}- {json.dumps(item)}")
    return "\n".join(out)


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for kind, schema in schemas().items():
        path = OUT / f"{kind}.json"
        body = json.dumps(schema, indent=2) + "\n"
        if check:
            if not path.exists() or path.read_text() != body:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(body)
    path = ROOT / "schemas/asyncapi.yaml"
    body = "# Generated by scripts/gen-event-schemas.py: edit that, not this.\n" + yaml(asyncapi()) + "\n"
    if check:
        if not path.exists() or path.read_text() != body:
            stale.append(str(path.relative_to(ROOT)))
    else:
        path.write_text(body)
    if stale:
        print("out of date (run python3 scripts/gen-event-schemas.py):", *stale, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Requests signed as Sluice signs its calls to tool services (Standard Webhooks), made with the
`standardwebhooks` library itself, so the tests check ToolApp against the scheme and not
against the SDK's own idea of it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

from sluice.tool import new_signing_key

#: The key the tests' tool apps verify and the tests' `sluice dev` signs with.
KEY = new_signing_key()


def signature(body: bytes, keys: list[str], message_id: str, timestamp: int) -> str:
    """The `webhook-signature` header: one `v1,` entry per key, space-separated."""
    at = datetime.fromtimestamp(timestamp, tz=UTC)
    return " ".join(Webhook(key).sign(message_id, at, body.decode()) for key in keys)


def sign(
    body: bytes = b"",
    keys: list[str] | None = None,
    *,
    message_id: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The three headers of a request signed with `keys` (default: the tests' `KEY`) now."""
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(body, keys or [KEY], message_id, timestamp),
    }


def post(
    url: str, body: Any, headers: dict[str, str] | None = None, **options: Any
) -> httpx.Response:
    """POST `body` as JSON, signed with the tests' key."""
    content = json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {}), **sign(content)}
    return httpx.post(url, content=content, headers=sent, **options)


def get(url: str, headers: dict[str, str] | None = None, **options: Any) -> httpx.Response:
    """GET, signed with the tests' key (a GET has no body: the signed content ends with '.')."""
    return httpx.get(url, headers={**(headers or {}), **sign()}, **options)

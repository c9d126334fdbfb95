"""Verifying that a request to a :class:`~sluice.tool.ToolApp` comes from Sluice.

Sluice signs every call to a tool service with the Standard Webhooks scheme
(https://www.standardwebhooks.com): a ``webhook-id`` unique to the request, a
``webhook-timestamp`` in unix seconds, and a ``webhook-signature`` holding one
``v1,<base64 HMAC-SHA256>`` entry per key Sluice holds, each over
``{webhook-id}.{webhook-timestamp}.{raw body}``. Keys are ``whsec_`` followed by the base64 of
the key bytes. A request is accepted when any entry matches any of this service's keys, so a
key can be rotated without a moment where the two sides disagree (docs/security.md, "Signed
calls to tool services").

Refused (401, before the body is parsed or a function runs): a request without the three
headers, a timestamp more than :data:`TOLERANCE_SECONDS` from this process's clock either way,
no entry matching any key, and a ``webhook-id`` already accepted within the tolerance window.
That last check is an in-memory cache of at most ``max_remembered`` ids per process: after a
restart (or on another worker process) a captured request could be replayed once more, but
only until its timestamp leaves the window, 5 minutes at most; a dispatch or compensate replayed
so is still answered from the idempotency store under its ``Idempotency-Key``.

The HMAC itself is the ``standardwebhooks`` library's; this module adds several keys, stricter
header parsing, messages that say what was wrong, and the replay cache.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from standardwebhooks import Webhook, WebhookVerificationError

from ..errors import SluiceError

#: The variable a :class:`~sluice.tool.ToolApp` reads its keys from when none are passed:
#: whitespace-separated ``whsec_`` keys.
ENV_VAR = "SLUICE_TOOL_SIGNING_KEYS"
#: How far a request's timestamp may be from this process's clock, either way (the scheme's 5
#: minutes); also how long an accepted ``webhook-id`` is remembered.
TOLERANCE_SECONDS = 5 * 60
#: The shortest key accepted: the scheme asks for at least 24 random bytes.
MIN_KEY_BYTES = 24
#: How many accepted ids are remembered at most (about 100 bytes each). Only requests whose
#: signature verified are remembered, so only a holder of a key can fill it; past this bound the
#: ids closest to leaving the window are forgotten first.
MAX_REMEMBERED = 100_000

_PREFIX = "whsec_"
_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
# One entry of webhook-signature: the version, a comma, standard base64 (HMAC-SHA256: 32 bytes).
_V1_ENTRY = re.compile(r"v1,([A-Za-z0-9+/]{43}=)")


class SigningKeyError(SluiceError, ValueError):
    """The tool side's signing keys are missing or malformed (raised when a ToolApp is built).

    The message names the key by its position and where it came from, never by its value."""


class Rejected(Exception):
    """A request that is not a valid signed call from Sluice; the message says why (answered
    401). It never holds a key."""


def new_signing_key() -> str:
    """A fresh random key (32 bytes) as ``whsec_<base64>``, for both sides' configuration."""
    return _PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def parse_keys(keys: Iterable[str], source: str) -> list[bytes]:
    """The key bytes of ``whsec_`` keys; a malformed one raises :class:`SigningKeyError` saying
    which (by position and ``source``) and what is wrong with it."""
    listed = list(keys)
    parsed = []
    for position, key in enumerate(listed, 1):
        which = f"signing key {position} of {len(listed)} (from {source})"
        if not isinstance(key, str) or not key.startswith(_PREFIX):
            raise SigningKeyError(
                f"{which} does not start with {_PREFIX}: a Standard Webhooks key is {_PREFIX} "
                "followed by the base64 of the key bytes"
            )
        encoded = key[len(_PREFIX) :]
        try:
            # Standard base64 with its padding, strictly: one spelling of a key on both sides.
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise SigningKeyError(
                f"{which}: the part after {_PREFIX} is not valid base64 (standard alphabet A-Z "
                "a-z 0-9 + /, padded with =)"
            ) from None
        if len(raw) < MIN_KEY_BYTES:
            raise SigningKeyError(
                f"{which} decodes to {len(raw)} bytes; a key needs at least {MIN_KEY_BYTES} "
                "random bytes (sluice.tool.new_signing_key() makes one of 32)"
            )
        parsed.append(raw)
    return parsed


class Verifier:
    """Checks the Standard Webhooks headers of requests against a set of keys, and remembers the
    ids it accepted within the tolerance window. Thread-safe."""

    def __init__(
        self,
        keys: list[bytes],
        *,
        tolerance: int = TOLERANCE_SECONDS,
        max_remembered: int = MAX_REMEMBERED,
    ) -> None:
        if not keys:
            raise SigningKeyError("a Verifier needs at least one key")
        self._webhooks = [Webhook(key) for key in keys]
        self._tolerance = tolerance
        self._max_remembered = max_remembered
        self._lock = threading.Lock()
        # Each accepted id until it leaves the window: the dict answers "seen?", the heap (by
        # expiry) says which to forget first.
        self._seen: dict[str, int] = {}
        self._expiries: list[tuple[int, str]] = []

    def check_headers(self, headers: Mapping[str, str]) -> None:
        """Refuses a request without the three headers, before its body is read."""
        missing = [name for name in _HEADERS if not headers.get(name)]
        if missing:
            raise Rejected(
                f"unsigned request: missing {', '.join(missing)}; every call from Sluice carries "
                "webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)"
            )

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Accepts a signed request once, or raises :class:`Rejected` saying what was wrong.

        ``headers`` are lower-case names; ``body`` is the raw body as received."""
        self.check_headers(headers)
        message_id = headers["webhook-id"]
        stamp = headers["webhook-timestamp"].strip()
        if not _TIMESTAMP.fullmatch(stamp):
            raise Rejected(f"webhook-timestamp must be whole unix seconds, not {stamp[:40]!r}")
        now = int(time.time())
        skew = now - int(stamp)
        if abs(skew) > self._tolerance:
            when = "in the past" if skew > 0 else "in the future"
            raise Rejected(
                f"webhook-timestamp is {abs(skew)} s {when}; a request more than "
                f"{self._tolerance} s from this service's clock is refused (a replay, or a clock "
                "that is off: check NTP on both sides)"
            )
        # The library stops at the first entry it cannot parse; keep the well-formed v1 entries
        # so that one unknown or garbled entry does not hide a valid one.
        entries = [
            entry for entry in headers["webhook-signature"].split(" ") if _V1_ENTRY.fullmatch(entry)
        ]
        if not entries:
            raise Rejected("webhook-signature holds no v1,<base64 HMAC-SHA256> entry")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            # Sluice sends JSON, always UTF-8; the library signs text.
            raise Rejected(
                "the body is not UTF-8: it cannot be a signed call from Sluice"
            ) from None
        checked = {
            "webhook-id": message_id,
            "webhook-timestamp": stamp,
            "webhook-signature": " ".join(entries),
        }
        if not any(self._matches(webhook, text, checked) for webhook in self._webhooks):
            raise Rejected(
                "webhook-signature: no v1 signature matches this service's signing keys: the "
                "request was signed with another key, or its id, timestamp or body changed after "
                "signing"
            )
        self._remember(message_id, int(stamp) + self._tolerance, now)

    @staticmethod
    def _matches(webhook: Webhook, text: str, headers: dict[str, str]) -> bool:
        try:
            webhook.verify(text, headers, json_parse=False)
        except WebhookVerificationError:
            return False
        return True

    def _remember(self, message_id: str, expires: int, now: int) -> None:
        with self._lock:
            while self._expiries and self._expiries[0][0] < now:
                _, gone = heapq.heappop(self._expiries)
                self._seen.pop(gone, None)
            if message_id in self._seen:
                raise Rejected(
                    f"webhook-id {message_id[:80]!r} was already accepted within the last "
                    f"{self._tolerance} s: a replayed request is refused (Sluice signs each "
                    "request, retries included, under a new id)"
                )
            while len(self._seen) >= self._max_remembered:
                _, gone = heapq.heappop(self._expiries)
                self._seen.pop(gone, None)
            self._seen[message_id] = expires
            heapq.heappush(self._expiries, (expires, message_id))


def signature_header(keys: Iterable[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` Sluice sends: one ``v1,`` entry per key, in the keys' order,
    space-separated (the shared vectors in sdk/test-vectors/standard-webhooks.json pin it)."""
    at = datetime.fromtimestamp(timestamp, tz=UTC)
    return " ".join(
        Webhook(key).sign(message_id, at, body.decode("utf-8"))
        for key in parse_keys(keys, "the keys given")
    )

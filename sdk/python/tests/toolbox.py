"""The tools the tests' Sluice calls: a small shop and bank written with sluice.tool.ToolApp.

`World` is the upstream's own record (what really happened), against which the tests check
what Sluice and the SDK report.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Any

from sluice import IDEMPOTENT, NON_IDEMPOTENT, OBSERVE_ONLY
from sluice.tool import Call, Refused, ToolApp

from signed import KEY

# Short horizons so ambiguous outcomes resolve within a test.
QUICK = {
    "timeout_ms": 2000,
    "lease_ttl_ms": 5000,
    "settle_ms": 100,
    "late_commit_ms": 100,
    "verify_after_ms": 800,
}


class World:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.ids = itertools.count(1)
        self.wires: dict[str, dict[str, Any]] = {}
        self.tickets: dict[str, dict[str, Any]] = {}
        self.compensations: list[tuple[str, str, str | None]] = []

    def count(self, tool: str) -> int:
        with self.lock:
            self.calls[tool] += 1
            return next(self.ids)


world = World()
# Verifies every call with the key the tests' `sluice dev` signs with (servers.SluiceDev).
app = ToolApp(signing_keys=[KEY])


@app.tool("shop/notify", semantics=IDEMPOTENT)
def notify(to: str, text: str, call: Call) -> dict[str, Any]:
    """Send a notification"""
    n = world.count("shop/notify")
    return {"id": f"n-{n}", "to": to, "text": text, "key": call.idempotency_key}


@app.tool("shop/search", semantics=OBSERVE_ONLY)
def search(query: str) -> dict[str, Any]:
    """Search the shop"""
    world.count("shop/search")
    return {"hits": [f"{query}-1", f"{query}-2"]}


def close_ticket(external_ref: str, call: Call) -> dict[str, Any]:
    with world.lock:
        world.tickets[external_ref]["open"] = False
        world.compensations.append(("shop/ticket", external_ref, call.dispatch_idempotency_key))
    return {"id": f"closed-{external_ref}"}


@app.tool("shop/ticket", semantics=IDEMPOTENT, compensate=close_ticket)
def open_ticket(title: str) -> dict[str, Any]:
    """Open a support ticket"""
    ref = f"t-{world.count('shop/ticket')}"
    with world.lock:
        world.tickets[ref] = {"title": title, "open": True}
    return {"id": ref, "title": title}


@app.tool("shop/slow", semantics=IDEMPOTENT)
def slow(seconds: float) -> dict[str, Any]:
    """Take a while"""
    time.sleep(seconds)
    return {"id": f"s-{world.count('shop/slow')}", "slept": seconds}


@app.tool("shop/refund", semantics=IDEMPOTENT, policy={"requires_approval": True})
def refund(order: str, amount_minor: int) -> dict[str, Any]:
    """Refund an order (a person approves each one)"""
    return {"id": f"rf-{world.count('shop/refund')}", "order": order, "amount_minor": amount_minor}


def find_wire(business_key: str) -> dict[str, Any] | list[dict[str, Any]] | None:
    with world.lock:
        found = [
            w for w in world.wires.values() if w["business_key"] == business_key and w["standing"]
        ]
    return found or None


def reverse_wire(external_ref: str, call: Call) -> dict[str, Any]:
    with world.lock:
        wire = world.wires[external_ref]
        if not wire["standing"]:
            raise Refused(f"wire {external_ref} is already reversed", status=409)
        wire["standing"] = False
        world.compensations.append(("bank/wire", external_ref, call.dispatch_idempotency_key))
    return {"id": f"rev-{external_ref}"}


@app.tool(
    "bank/wire",
    semantics=NON_IDEMPOTENT,
    business_key="{account}:{amount_minor}:{memo}",
    status=find_wire,
    compensate=reverse_wire,
    policy={"max_attempts": 2, **QUICK},
)
def wire(account: str, amount_minor: int, memo: str, call: Call) -> dict[str, Any]:
    """Send a wire transfer"""
    if amount_minor <= 0:
        raise Refused("amount_minor must be positive")
    ref = f"w-{world.count('bank/wire')}"
    with world.lock:
        world.wires[ref] = {
            "id": ref,
            "account": account,
            "amount_minor": amount_minor,
            "business_key": call.business_key,
            "standing": True,
        }
    return {"id": ref, "account": account, "amount_minor": amount_minor}


def bank_lookup_down(business_key: str) -> dict[str, Any]:
    raise ConnectionError("the bank's lookup service is down")


@app.tool(
    "bank/flaky",
    semantics=NON_IDEMPOTENT,
    business_key="{ref}",
    status=bank_lookup_down,
    policy={"max_attempts": 1, "max_checks": 1, **QUICK},
)
def flaky_wire(ref: str) -> dict[str, Any]:
    """A bank whose every answer is lost (and whose lookups are down)"""
    world.count("bank/flaky")
    raise TimeoutError("the bank hung up after the request was sent")


@app.tool("bank/unsafe", semantics=NON_IDEMPOTENT, allow_unsafe=True)
def unsafe(note: str) -> dict[str, Any]:
    """A non-idempotent tool nothing can look up or undo"""
    return {"id": f"u-{world.count('bank/unsafe')}"}


def catalog(base_url: str) -> str:
    header = 'default_namespace = "shop"\npolicy_version = "test-1"\n\n'
    return header + app.catalog_toml(base_url)

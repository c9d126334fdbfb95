"""Stripe charges for Sluice: charge, look up by Sluice's key, refund — a signed tool service.

Sluice calls this service (``ToolApp`` from Sluice's Python SDK) and it calls Stripe, or
localstripe, the Stripe emulator the tests run. It is an adapter rather than a catalog entry
because localstripe cannot be looked up declaratively: it has no search API (its
``/v1/charges/search`` route answers the same 404 as a charge that does not exist), its charge
list filters on no metadata, and a list filtered by Sluice would read one page only. Here the
lookup lists every page and keeps the charges whose ``metadata.sluice_key`` is the key. For the
real Stripe API, which has a search API and remembers idempotency keys, ``catalog.real-stripe.toml``
describes the same tool declaratively, with no service in between.

Every request must be signed by Sluice (Standard Webhooks, ``SLUICE_TOOL_SIGNING_KEYS``);
anything else is answered 401 before it is read. The Stripe key is read from
``STRIPE_SECRET_KEY`` at each call, ``STRIPE_API_BASE`` says where Stripe is.

    python adapter.py --port 9010                                    # serve
    python -m sluice.tool adapter:app http://127.0.0.1:9010          # print Sluice's catalog entries
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx

import sluice
from sluice.tool import Call, Refused, ToolApp

#: The API version every request pins, so Stripe's answers keep the shape read here.
STRIPE_VERSION = "2024-06-20"
#: How long one call to Stripe may take. Sluice's catalog entry declares it as ``late_commit_ms``:
#: a charge this service sent may still land that long after Sluice stopped waiting for it.
STRIPE_TIMEOUT_S = 10.0
#: Charges per page when listing (Stripe's maximum).
PAGE = 100

app = ToolApp()


def _stripe(
    method: str,
    path: str,
    *,
    form: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> httpx.Response:
    base = os.environ.get("STRIPE_API_BASE", "https://api.stripe.com").rstrip("/")
    headers = {
        "Authorization": f"Bearer {os.environ['STRIPE_SECRET_KEY']}",
        "Stripe-Version": STRIPE_VERSION,
    }
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return httpx.request(
        method,
        base + path,
        data=form,
        params=params,
        headers=headers,
        timeout=STRIPE_TIMEOUT_S,
    )


def _answer(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON of a 2xx; a refusal for a definite 4xx; an exception (outcome unknown) else.

    Stripe answers 409 while a request with the same idempotency key is in progress and 429
    when it sheds load: neither says what happened, so they are not refusals."""
    if response.is_success:
        body: dict[str, Any] = response.json()
        return body
    if 400 <= response.status_code < 500 and response.status_code not in (408, 409, 425, 429):
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {"message": response.text[:200]}
        raise Refused(
            f"{what}: Stripe answered {response.status_code}: {error.get('message')}",
            status=response.status_code,
            details=error,
        )
    raise RuntimeError(f"{what}: Stripe answered {response.status_code}: {response.text[:200]}")


def _summary(charge: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": charge["id"],
        "amount": charge["amount"],
        "currency": charge["currency"],
        "status": charge["status"],
        "order_id": (charge.get("metadata") or {}).get("order_id"),
    }


def find_charges(idempotency_key: str) -> list[dict[str, Any]]:
    """Every charge that Sluice's call with this key made and that went through: all pages of
    the charge list, filtered here on ``metadata.sluice_key`` (a declined charge is stored too,
    with ``status: failed``, and is not a commit). Raising means the lookup proved nothing: the
    service answers 503 and Sluice asks again, never reading it as absent."""
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": PAGE}
    while True:
        page = _answer(_stripe("GET", "/v1/charges", params=params), "listing charges")
        charges = page["data"]
        found += [
            _summary(charge)
            for charge in charges
            if (charge.get("metadata") or {}).get("sluice_key") == idempotency_key
            and charge.get("status") in ("succeeded", "pending")
        ]
        if not page.get("has_more") or not charges:
            return found
        params["starting_after"] = charges[-1]["id"]


def refund(external_ref: str, call: Call) -> dict[str, Any]:
    """Refunds the charge in full, once: a charge already refunded answers with its refund
    (localstripe, unlike Stripe, would refund a charge twice)."""
    charge = _answer(_stripe("GET", f"/v1/charges/{external_ref}"), f"reading {external_ref}")
    existing = (charge.get("refunds") or {}).get("data") or []
    if charge.get("refunded") and existing:
        return {"id": existing[0]["id"], "charge": external_ref, "already": True}
    made = _answer(
        _stripe(
            "POST",
            "/v1/refunds",
            form={"charge": external_ref, "metadata[sluice_key]": call.idempotency_key},
            idempotency_key=call.idempotency_key,
        ),
        f"refunding {external_ref}",
    )
    return {"id": made["id"], "charge": external_ref}


@app.tool(
    "payments/charge",
    semantics=sluice.NON_IDEMPOTENT,
    status=find_charges,
    compensate=refund,
    schema={
        "type": "object",
        "additionalProperties": False,
        "required": ["amount", "currency", "source", "order_id"],
        "properties": {
            "amount": {"type": "integer", "minimum": 50},
            "currency": {"type": "string", "pattern": "^[a-z]{3}$"},
            "source": {"type": "string", "minLength": 1},
            "order_id": {"type": "string", "minLength": 1, "maxLength": 200},
        },
    },
    policy={
        # Sluice's call (and the lookup's: it must fit the reconciler's 15 s sweep budget).
        "timeout_ms": 12000,
        "late_commit_ms": int(STRIPE_TIMEOUT_S * 1000),
        "settle_ms": 2000,
        "verify_after_ms": 15000,
    },
)
def charge(amount: int, currency: str, source: str, order_id: str, call: Call) -> dict[str, Any]:
    """Charge a card (or source) for an order."""
    made = _answer(
        _stripe(
            "POST",
            "/v1/charges",
            form={
                "amount": amount,
                "currency": currency,
                "source": source,
                "description": f"order {order_id}",
                "metadata[order_id]": order_id,
                "metadata[sluice_key]": call.idempotency_key,
            },
            # Stripe itself remembers it for 24 hours; localstripe ignores it.
            idempotency_key=call.idempotency_key,
        ),
        "charging",
    )
    return _summary(made)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9010)
    options = parser.parse_args()
    uvicorn.run(app, host=options.host, port=options.port, log_level="warning")

"""The tool side of Sluice: turn plain functions into an upstream that speaks the wire contract.

::

    from sluice.tool import ToolApp, SQLiteStore, Refused

    # Only calls signed by Sluice are served: the whsec_ keys come from SLUICE_TOOL_SIGNING_KEYS.
    app = ToolApp(store=SQLiteStore("refunds.db"))

    def find_refund(business_key: str) -> dict | None: ...      # your system of record
    def reverse_refund(external_ref: str) -> dict: ...

    @app.tool("payments/refund", semantics="NON_IDEMPOTENT",
              business_key="{order}:{amount_minor}", status=find_refund, compensate=reverse_refund)
    def refund(order: str, amount_minor: int) -> dict:
        \"\"\"Refund part of an order.\"\"\"
        return {"id": issue_refund(order, amount_minor)}

    print(app.catalog_toml("http://127.0.0.1:9000"))   # the credential and entries for Sluice
    # serve with any ASGI server: uvicorn module:app --port 9000
"""

from .app import DEFAULT_CREDENTIAL, Call, Refused, ToolApp, ToolSpec, schema_of
from .signing import ENV_VAR, SigningKeyError, new_signing_key, signature_header
from .store import IdempotencyStore, MemoryStore, Record, SQLiteStore

__all__ = [
    "DEFAULT_CREDENTIAL",
    "ENV_VAR",
    "Call",
    "IdempotencyStore",
    "MemoryStore",
    "Record",
    "Refused",
    "SQLiteStore",
    "SigningKeyError",
    "ToolApp",
    "ToolSpec",
    "new_signing_key",
    "schema_of",
    "signature_header",
]

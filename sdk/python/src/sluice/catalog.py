"""The server's tool catalog as an agent sees it (``GET /v1/tools``), and the checks that a
decorated tool matches it.

The checks run when a decorated tool is declared with a client, or when it is first called in
a run of a client (its first bind): an outbox tool the server does not know is refused, and so
is ``@effect`` on a NON_IDEMPOTENT tool, before anything is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._ids import InvalidId, resolve_tool
from .errors import DeclarationError

IDEMPOTENT = "IDEMPOTENT"
NON_IDEMPOTENT = "NON_IDEMPOTENT"
OBSERVE_ONLY = "OBSERVE_ONLY"


@dataclass(frozen=True)
class ToolDescription:
    """One tool as ``GET /v1/tools`` describes it (``ToolDescription`` in schemas/openapi.yaml)."""

    name: str
    description: str
    semantics: str
    args_schema: dict[str, Any]
    requires_approval: bool
    approve_above: dict[str, Any] | None
    business_key: str | None
    status_check: bool
    compensable: bool
    max_attempts: int = 1
    timeout_ms: int = 0

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ToolDescription:
        return cls(
            name=body["name"],
            description=body.get("description", ""),
            semantics=body["semantics"],
            args_schema=body.get("args_schema", {}),
            requires_approval=bool(body.get("requires_approval", False)),
            approve_above=body.get("approve_above"),
            business_key=body.get("business_key"),
            status_check=bool(body.get("status_check", False)),
            compensable=bool(body.get("compensable", False)),
            max_attempts=int(body.get("max_attempts", 1)),
            timeout_ms=int(body.get("timeout_ms", 0)),
        )


@dataclass(frozen=True)
class Catalog:
    """The tools a server knows, in declaration order, and its default namespace."""

    default_namespace: str
    policy_version: str
    tools: dict[str, ToolDescription] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Catalog:
        tools = [ToolDescription.from_json(tool) for tool in body.get("tools", [])]
        return cls(
            default_namespace=body["default_namespace"],
            policy_version=body.get("policy_version", ""),
            tools={tool.name: tool for tool in tools},
        )

    def resolve(self, name: str) -> str:
        """The qualified name: a bare name is placed in the server's default namespace."""
        return resolve_tool(name, self.default_namespace)

    def get(self, name: str) -> ToolDescription | None:
        try:
            return self.tools.get(self.resolve(name))
        except InvalidId:
            return None


def check_declaration(
    catalog: Catalog, tool: str, kind: str, *, allow_unsafe: bool = False, function: str = ""
) -> ToolDescription:
    """Checks that decorating ``function`` as ``kind`` (``effect`` or ``outbox_tool``) for
    ``tool`` is safe against the server's catalog; returns the tool's description.

    Raises :class:`DeclarationError` with what to change otherwise.
    """
    where = f"@sluice.{kind}(tool={tool!r})" + (f" on {function}()" if function else "")
    try:
        qualified = catalog.resolve(tool)
    except InvalidId as invalid:
        raise DeclarationError(f"{where}: {invalid}") from None
    described = catalog.tools.get(qualified)
    known = ", ".join(sorted(catalog.tools)) or "none"
    if described is None:
        raise DeclarationError(
            f"{where}: the server's catalog has no tool {qualified!r} (known: {known}). "
            "Sluice records an effect only for a tool the catalog declares, with its semantics "
            "and how to look it up or undo it. Fix the name, or declare the tool in the catalog "
            "(deploy/catalog.toml; sluice.tool.ToolServer.catalog_toml() prints an entry) and "
            "restart the server."
        )
    if kind == "effect" and described.semantics == NON_IDEMPOTENT:
        raise DeclarationError(
            f"{where}: the catalog declares {qualified} NON_IDEMPOTENT: calling it twice may "
            "commit twice, so it is never retried without evidence. Declare it with "
            f"@sluice.outbox_tool(tool={tool!r}) so the code says so too; if the upstream does "
            "deduplicate by Idempotency-Key, change its semantics to IDEMPOTENT in the catalog."
        )
    if kind == "outbox_tool" and described.semantics != NON_IDEMPOTENT:
        raise DeclarationError(
            f"{where}: the catalog declares {qualified} {described.semantics}, so Sluice retries "
            "it with the same idempotency key after an ambiguous outcome. If the upstream may "
            "commit twice, change its semantics to NON_IDEMPOTENT in the catalog (with a "
            "status_check, business_key or compensate); if it really is "
            f"{described.semantics}, declare it with @sluice.effect(tool={tool!r})."
        )
    if (
        kind == "outbox_tool"
        and not allow_unsafe
        and not (described.business_key or described.status_check or described.compensable)
    ):
        raise DeclarationError(
            f"{where}: {qualified} is NON_IDEMPOTENT with no business key, no status check and "
            "no compensate: an ambiguous outcome can never be resolved and every one will wait "
            "for a person (STUCK). Give the tool a status_check (or business_key, or compensate) "
            "in the catalog, or pass allow_unsafe=True after review."
        )
    return described

"""Sluice for Python agents: record every side effect in a ledger before it runs, execute it
under a stable idempotency key, and get typed outcomes back.

::

    import sluice

    @sluice.outbox_tool(tool="payments/wire")
    def pay(amount_minor: int) -> dict:
        return {"account": "acc-1", "amount_minor": amount_minor,
                "beneficiary": "b-9", "date": "2026-11-22"}

    with sluice.Client().run("order-42"):
        wire = pay(125_000)          # the bank's answer, recorded; once, however often re-driven

The tool side (an upstream speaking Sluice's wire contract) is :mod:`sluice.tool`.
"""

from ._ids import CommandKey, InvalidId, Journal, check_run_id, check_tool_name, resolve_tool
from ._protocol import Retries
from .aio import AsyncClient, AsyncRun
from .catalog import IDEMPOTENT, NON_IDEMPOTENT, OBSERVE_ONLY, Catalog, ToolDescription
from .client import Client, Run
from .effects import Declaration, effect, outbox_tool
from .errors import (
    ApiError,
    ArgumentDrift,
    AwaitingApproval,
    BudgetExceeded,
    BusinessKeyHeld,
    Conflict,
    DeclarationError,
    EffectCancelled,
    EffectError,
    EffectFailed,
    EffectRolledBack,
    EffectStuck,
    EffectTimeout,
    Forbidden,
    InvalidRequest,
    NoActiveRun,
    NotFound,
    OverQuota,
    RunRolledBack,
    SluiceError,
    Unauthorized,
    Unavailable,
)
from .models import ApprovalLink, Effect, Rejection, Revision, RollbackProgress, RollbackStep

__all__ = [
    "IDEMPOTENT",
    "NON_IDEMPOTENT",
    "OBSERVE_ONLY",
    "ApiError",
    "ApprovalLink",
    "ArgumentDrift",
    "AsyncClient",
    "AsyncRun",
    "AwaitingApproval",
    "BudgetExceeded",
    "BusinessKeyHeld",
    "Catalog",
    "Client",
    "CommandKey",
    "Conflict",
    "Declaration",
    "DeclarationError",
    "Effect",
    "EffectCancelled",
    "EffectError",
    "EffectFailed",
    "EffectRolledBack",
    "EffectStuck",
    "EffectTimeout",
    "Forbidden",
    "InvalidId",
    "InvalidRequest",
    "Journal",
    "NoActiveRun",
    "NotFound",
    "OverQuota",
    "Rejection",
    "Revision",
    "Retries",
    "RollbackProgress",
    "RollbackStep",
    "Run",
    "RunRolledBack",
    "SluiceError",
    "ToolDescription",
    "Unauthorized",
    "Unavailable",
    "check_run_id",
    "check_tool_name",
    "effect",
    "outbox_tool",
    "resolve_tool",
]

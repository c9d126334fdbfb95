"""What the framework adapters share: a framework's tool calls as Sluice effects.

A framework names each tool call its model makes (OpenAI's ``call_id``, LangChain's
``tool_call_id``). :class:`Calls` gives each call id one journal position of the run, taken the
first time the call is seen: a call the framework executes again (a LangGraph node re-run on
resume, an approved call of a resumed ``RunState``) keeps its key, and is answered by the ledger
with the effect it already recorded. An agent re-run from the start (a fresh :class:`Calls` on
the same run id, the same calls in the same order) walks the same positions and gets the stored
results, whatever ids the framework gives the calls this time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import _protocol as proto
from .._ids import CommandKey
from ..catalog import Catalog, ToolDescription
from ..models import Effect

if TYPE_CHECKING:
    from ..aio import AsyncRun
    from ..client import Run


def framework_name(tool: str) -> str:
    """The name a framework's model calls ``tool`` by: ``shop/refund`` → ``shop__refund``
    (function names may not hold ``/``; the MCP gateway names tools the same way)."""
    return tool.replace("/", "__")


def tool_of(catalog: Catalog, name: str) -> ToolDescription:
    """The catalog's tool ``name`` (``namespace/name``, a bare name in the default namespace);
    ValueError naming the known tools when there is none."""
    found = catalog.get(name)
    if found is None:
        known = ", ".join(sorted(catalog.tools)) or "none"
        raise ValueError(f"the server's catalog has no tool {name!r} (known: {known})")
    return found


def may_need_approval(tool: ToolDescription) -> bool:
    """Whether the catalog's policy can hold a call of ``tool`` for a person's approval."""
    return tool.requires_approval or tool.approve_above is not None


def description(tool: ToolDescription) -> str:
    text = tool.description or tool.name
    if tool.requires_approval:
        return f"{text} (each call waits for a person's approval)"
    if tool.approve_above is not None:
        above = tool.approve_above
        return f"{text} (a call with {above['field']} above {above['value']} waits for approval)"
    return text


@dataclass(frozen=True)
class Pending:
    """An effect Sluice holds BLOCKED for a person's approval: what an interruption carries.

    ``remedy`` holds the console command lines a person with an approver's token runs
    (``sluice approve RUN KEY --reason …`` or ``sluice reject …``).
    """

    run_id: str
    command_key: str
    idempotency_key: str
    tool: str
    args: dict[str, Any]
    status: str
    remedy: str

    @classmethod
    def of(cls, effect: Effect) -> Pending:
        error = proto.effect_error(effect)
        return cls(
            run_id=effect.run_id,
            command_key=effect.command_key,
            idempotency_key=effect.idempotency_key,
            tool=effect.tool,
            args=dict(effect.args),
            status=effect.status,
            remedy=error.remedy if error is not None else "",
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def result_of(effect: Effect) -> Any:
    """The upstream's answer of a CONFIRMED effect; the typed EffectError of any other."""
    return proto.outcome(effect).result


def still_blocked(effect: Effect) -> dict[str, Any]:
    """What a model is told when a call its app approved still waits for Sluice's approval."""
    pending = Pending.of(effect)
    return {
        "status": effect.status,
        "command_key": effect.command_key,
        "message": "this call waits for a person's approval in Sluice; nothing ran yet",
        "remedy": pending.remedy,
    }


class _Positions:
    """One journal position per framework call id."""

    def __init__(self) -> None:
        self._keys: dict[str, CommandKey] = {}
        self._lock = threading.Lock()

    def take(self, run: Run | AsyncRun, tool: str, call_id: str | None) -> CommandKey:
        # ``tool`` is the catalog's qualified name: no catalog lookup, nothing awaited, so calls
        # started in the model's order take their positions in that order.
        core = run._core
        if call_id is None:
            return core.position(None, tool)
        with self._lock:
            key = self._keys.get(call_id)
            if key is None:
                key = core.position(None, tool)
                self._keys[call_id] = key
            return key


class Calls:
    """A synchronous run's tool calls (LangGraph's sync tools)."""

    def __init__(self, run: Run, *, wait: float | None = None) -> None:
        self.run = run
        self.wait = wait
        self._positions = _Positions()

    def catalog(self) -> Catalog:
        return self.run.client.tools()

    def patience(self) -> float:
        return self.run._core.config.wait if self.wait is None else self.wait

    def submit(self, tool: str, args: Mapping[str, Any], call_id: str | None) -> Effect:
        """Records the call's effect at its position and waits for it to settle (BLOCKED is
        settled: returned as it is). Refusals raise their ApiError."""
        key = self._positions.take(self.run, tool, call_id)
        return self.run.client.drive(self.run._core.submit(key, args, self.wait))

    def wait_for_people(self, effect: Effect, timeout: float) -> Effect:
        """Waits up to ``timeout`` s for a person's decision on a BLOCKED effect; returns it as it
        then stands (still BLOCKED when nobody decided)."""
        return self.run.client.drive(_through_people(self.run, effect, timeout))

    def remove(self, effect: Effect, reason: str) -> Effect:
        return self.run.remove_scheduled_effect(effect.command_key, reason)


class AsyncCalls:
    """An asyncio run's tool calls (the OpenAI Agents SDK)."""

    def __init__(self, run: AsyncRun, *, wait: float | None = None) -> None:
        self.run = run
        self.wait = wait
        self._positions = _Positions()

    async def catalog(self) -> Catalog:
        return await self.run.client.tools()

    def patience(self) -> float:
        return self.run._core.config.wait if self.wait is None else self.wait

    async def submit(self, tool: str, args: Mapping[str, Any], call_id: str | None) -> Effect:
        key = self._positions.take(self.run, tool, call_id)
        return await self.run.client.drive(self.run._core.submit(key, args, self.wait))

    async def wait_for_people(self, effect: Effect, timeout: float) -> Effect:
        return await self.run.client.drive(_through_people(self.run, effect, timeout))

    async def remove(self, effect: Effect, reason: str) -> Effect:
        return await self.run.remove_scheduled_effect(effect.command_key, reason)


def _through_people(
    run: Run | AsyncRun, effect: Effect, timeout: float
) -> proto.Conversation[Effect]:
    return proto.poll(
        effect,
        deadline=time.monotonic() + timeout,
        retries=run._core.config.retries,
        through_people=True,
    )

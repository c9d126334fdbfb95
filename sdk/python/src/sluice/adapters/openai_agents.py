"""The OpenAI Agents SDK (``openai-agents``, tested with 0.24.0): Sluice catalog tools as the
SDK's ``FunctionTool``\\ s, each invocation a Sluice effect at its journal position.

::

    from agents import Agent, Runner
    import sluice
    from sluice.adapters.openai_agents import SluiceTools

    async with sluice.AsyncClient() as client:
        async with client.run("order-42") as run:
            tools = SluiceTools(run)
            agent = Agent(name="support", tools=await tools.all())  # or tools.get("shop/refund")
            result = await Runner.run(agent, "refund order 42")
            while result.interruptions:  # Sluice holds a call for a person's approval
                state = result.to_state()
                await tools.settle(state, timeout=600)  # the person decides in Sluice
                result = await Runner.run(agent, state)

A call the catalog's policy may hold for approval (``requires_approval``, ``approve_above``) is
recorded when the model makes it, through the tool's ``needs_approval``: if Sluice holds it
BLOCKED, the run stops with the SDK's own interruption (``result.interruptions``), nothing has
run upstream, and :meth:`SluiceTools.pending` gives the Sluice effect behind an interruption
(its command key and the console line that approves it). The approval that counts is Sluice's,
given by a person with an approver's token; :meth:`SluiceTools.settle` waits for it and mirrors
it into the ``RunState`` (approve, or reject with Sluice's reason). A call the application
approves in the SDK without Sluice's approval waits for Sluice's up to ``approval_wait`` seconds
and then tells the model it still waits; one it rejects in the SDK should be rejected with
:meth:`SluiceTools.reject`, which also removes the BLOCKED effect from Sluice.

Resume a ``RunState`` with the same :class:`SluiceTools` (its call ids hold their positions); in
a new process, re-run the agent from the start with the same run id instead: the journal walks
the same positions and the ledger answers with the stored effects.
"""

from __future__ import annotations

import json
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem
from agents.tool_context import ToolContext

from ..aio import AsyncRun
from ..catalog import ToolDescription
from ..errors import EffectError
from ..models import Effect
from ._calls import (
    AsyncCalls,
    Pending,
    description,
    framework_name,
    may_need_approval,
    result_of,
    still_blocked,
    tool_of,
)

__all__ = ["Pending", "SluiceTools"]


class SluiceTools:
    """The catalog's tools as ``FunctionTool``\\ s whose calls are effects of ``run``.

    ``wait`` is how long a call waits for its effect to settle (the client's by default);
    ``approval_wait`` how long a call the application approved waits for Sluice's approval.
    """

    def __init__(
        self, run: AsyncRun, *, wait: float | None = None, approval_wait: float = 0.0
    ) -> None:
        self.run = run
        self.approval_wait = approval_wait
        self._calls = AsyncCalls(run, wait=wait)
        self._effects: dict[str, Effect] = {}
        self._errors: dict[str, BaseException] = {}

    async def all(self) -> list[FunctionTool]:
        """Every tool of the server's catalog (``GET /v1/tools``)."""
        catalog = await self._calls.catalog()
        return [self.tool(tool) for tool in catalog.tools.values()]

    async def get(self, *names: str) -> list[FunctionTool]:
        """The named tools (``namespace/name``, or bare in the default namespace)."""
        catalog = await self._calls.catalog()
        return [self.tool(tool_of(catalog, name)) for name in names]

    def tool(self, tool: ToolDescription) -> FunctionTool:
        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            return await self._invoke(tool, context.tool_call_id, arguments)

        async def needs_approval(
            context: RunContextWrapper[Any], params: dict[str, Any], call_id: str
        ) -> bool:
            return await self._needs_approval(tool, params, call_id)

        return FunctionTool(
            name=framework_name(tool.name),
            description=description(tool),
            params_json_schema=tool.args_schema or {"type": "object"},
            on_invoke_tool=invoke,
            # Sluice validates the arguments against the catalog's own schema.
            strict_json_schema=False,
            needs_approval=needs_approval if may_need_approval(tool) else False,
        )

    async def _needs_approval(
        self, tool: ToolDescription, args: dict[str, Any], call_id: str
    ) -> bool:
        # The SDK asks before it invokes: the effect is recorded now, and Sluice's policy says
        # whether it waits for a person. A refusal is kept for the invocation to raise (the SDK
        # would take an exception here for "needs approval").
        try:
            effect = await self._calls.submit(tool.name, args, call_id)
        except Exception as refused:
            self._errors[call_id] = refused
            return False
        self._effects[call_id] = effect
        return effect.status == "BLOCKED"

    async def _invoke(self, tool: ToolDescription, call_id: str, arguments: str) -> str:
        if call_id in self._errors:
            raise self._errors.pop(call_id)
        effect = self._effects.pop(call_id, None)
        if effect is None:
            args = json.loads(arguments or "{}")
            effect = await self._calls.submit(tool.name, args, call_id)
        if effect.status == "BLOCKED":
            # The application let the call go on: Sluice's approval is still what runs it.
            effect = await self._calls.wait_for_people(effect, self.approval_wait)
            if effect.status == "BLOCKED":
                return json.dumps(still_blocked(effect))
        if not effect.settled:
            # Approved in Sluice and now running: waited for as any call is.
            effect = await self._calls.wait_for_people(effect, self._calls.patience())
        try:
            return json.dumps(result_of(effect))
        except EffectError as error:
            # The model is told what happened (FAILED, STUCK, CANCELLED, …) and what a person
            # can do; refusals of the request itself (ApiError) fail the run.
            return json.dumps({"error": error.status, "message": str(error)})

    def pending(self, item: ToolApprovalItem) -> Pending | None:
        """The Sluice effect behind an interruption, if one of these tools made it."""
        effect = self._effects.get(_call_id(item))
        return Pending.of(effect) if effect is not None else None

    async def settle(self, state: RunState[Any, Any], *, timeout: float = 0.0) -> list[Pending]:
        """Waits up to ``timeout`` s for Sluice's decision on each of ``state``'s interruptions
        made by these tools and mirrors it: rejected, cancelled or expired in Sluice (CANCELLED)
        → ``state.reject`` with what Sluice recorded; approved → ``state.approve`` (the
        invocation then returns the effect's outcome). Returns those still waiting for a
        person."""
        waiting: list[Pending] = []
        for item in state.get_interruptions():
            call_id = _call_id(item)
            effect = self._effects.get(call_id)
            if effect is None:
                continue
            effect = await self._calls.wait_for_people(effect, timeout)
            self._effects[call_id] = effect
            if effect.status == "BLOCKED":
                waiting.append(Pending.of(effect))
            elif effect.status == "CANCELLED":
                # Rejected by a person, or its approval expired: it never ran.
                state.reject(item, rejection_message=_refusal(effect))
            else:
                state.approve(item)
        return waiting

    async def reject(self, state: RunState[Any, Any], item: ToolApprovalItem, reason: str) -> None:
        """Rejects an interruption in the SDK and removes its BLOCKED effect from Sluice (an
        agent may cancel its own effect that has not run; ``reason`` goes to the audit chain)."""
        effect = self._effects.get(_call_id(item))
        if effect is not None:
            self._effects[_call_id(item)] = await self._calls.remove(effect, reason)
        state.reject(item, rejection_message=f"rejected: {reason}")


def _call_id(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    found = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return str(found)


def _refusal(effect: Effect) -> str:
    why = effect.last_error or "rejected in Sluice"
    return f"{effect.tool} was not run: it is {effect.status} in Sluice ({why})"

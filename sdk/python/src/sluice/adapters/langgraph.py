"""LangGraph / LangChain (``langgraph``, ``langchain-core``; tested with 1.2.22 and 1.8.1):
Sluice catalog tools as LangChain ``BaseTool``\\ s for a ``ToolNode`` or any tool-calling loop,
each call a Sluice effect at its journal position.

::

    import sluice
    from sluice.adapters.langgraph import SluiceToolkit

    with sluice.Client().run("order-42") as run:
        tools = SluiceToolkit(run).all()             # or .get("shop/refund", "shop/search")
        graph = build_graph(model.bind_tools(tools), ToolNode(tools), checkpointer=InMemorySaver())
        state = graph.invoke({"messages": [...]}, config)
        while state.get("__interrupt__"):            # Sluice holds a call for a person's approval
            pending = state["__interrupt__"][0].value["sluice"]   # command key, remedy
            state = graph.invoke(Command(resume={"approved": True}), config)

A call Sluice holds BLOCKED for approval stops the graph with LangGraph's ``interrupt`` (a
checkpointer is needed, as for any interrupt); its value is ``{"sluice": {...}}``, the
:class:`~sluice.adapters.Pending` effect (run id, command key, tool, args, and the console line
a person with an approver's token runs). Resume with ``Command(resume=...)``:

* ``{"approved": False, "reason": "..."}`` (or ``False``) removes the BLOCKED effect from
  Sluice (the reason goes to the audit chain) and tells the model it was rejected;
* anything else waits up to ``approval_wait`` seconds for Sluice's decision, which is the one
  that counts: approved there, the tool returns the upstream's answer; rejected, it says so;
  still undecided, the graph is interrupted again.

The resumed node runs the tool again from its start; the call keeps its journal position (by
LangChain's ``tool_call_id``) and the ledger answers with the effect it recorded. Resume with the
same toolkit; in a new process re-run the agent from the start with the same run id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.types import interrupt
from pydantic import ConfigDict

from ..catalog import ToolDescription
from ..client import Run
from ..errors import Conflict, EffectError
from ..models import Effect
from ._calls import (
    Calls,
    Pending,
    description,
    framework_name,
    result_of,
    tool_of,
)

__all__ = ["Pending", "SluiceTool", "SluiceToolkit"]


class SluiceToolkit:
    """The catalog's tools as LangChain tools whose calls are effects of ``run`` (a sync
    :class:`sluice.Run`: invoke the graph with ``invoke``/``stream``)."""

    def __init__(self, run: Run, *, wait: float | None = None, approval_wait: float = 0.0) -> None:
        self.run = run
        self.approval_wait = approval_wait
        self.calls = Calls(run, wait=wait)

    def all(self) -> list[BaseTool]:
        """Every tool of the server's catalog (``GET /v1/tools``)."""
        return [self.tool(tool) for tool in self.calls.catalog().tools.values()]

    def get(self, *names: str) -> list[BaseTool]:
        """The named tools (``namespace/name``, or bare in the default namespace)."""
        catalog = self.calls.catalog()
        return [self.tool(tool_of(catalog, name)) for name in names]

    def tool(self, tool: ToolDescription) -> SluiceTool:
        return SluiceTool(
            name=framework_name(tool.name),
            description=description(tool),
            args_schema=tool.args_schema or {"type": "object", "properties": {}},
            sluice_tool=tool.name,
            toolkit=self,
        )


class SluiceTool(BaseTool):
    """One catalog tool; made by :class:`SluiceToolkit`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    sluice_tool: str
    toolkit: SluiceToolkit

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The model's arguments as one dict, and the call's id: its journal position.
        if isinstance(tool_input, str):
            raise ValueError(f"{self.name} takes a JSON object of arguments, not a string")
        return (), {"arguments": dict(tool_input), "call_id": tool_call_id}

    def _run(self, arguments: Mapping[str, Any], call_id: str | None, **_: Any) -> str:
        calls = self.toolkit.calls
        effect = calls.submit(self.sluice_tool, arguments, call_id)
        while effect.status == "BLOCKED":
            decision = interrupt({"sluice": Pending.of(effect).to_json()})
            approved, reason = _decision(decision)
            if not approved:
                return json.dumps(_rejected(calls, effect, reason))
            effect = calls.wait_for_people(effect, self.toolkit.approval_wait)
        if not effect.settled:
            effect = calls.wait_for_people(effect, calls.patience())
        try:
            return json.dumps(result_of(effect))
        except EffectError as error:
            return json.dumps({"error": error.status, "message": str(error)})


def _decision(value: Any) -> tuple[bool, str]:
    if value is False:
        return False, "rejected by the application"
    if isinstance(value, Mapping) and value.get("approved") is False:
        return False, str(value.get("reason") or "rejected by the application")
    return True, ""


def _rejected(calls: Calls, effect: Effect, reason: str) -> dict[str, Any]:
    try:
        effect = calls.remove(effect, reason)
    except Conflict:
        # A person decided in Sluice meanwhile; Sluice's decision stands.
        effect = calls.wait_for_people(calls.run.get(effect.command_key), calls.patience())
        if effect.status == "CONFIRMED":
            return {"approved_in_sluice": True, "result": effect.result}
    return {"status": effect.status, "message": f"rejected: {reason}"}

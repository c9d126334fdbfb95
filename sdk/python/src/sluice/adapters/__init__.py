"""Sluice tools for agent frameworks: each tool call an agent's model makes becomes a Sluice
effect at its journal position in the current Sluice run.

* :mod:`sluice.adapters.openai_agents` — the OpenAI Agents SDK (``pip install
  'sluice-sdk[openai-agents]'``): ``FunctionTool``\\ s; a tool Sluice holds for approval is the
  SDK's own interruption (``needs_approval``, ``RunState`` approve/reject).
* :mod:`sluice.adapters.langgraph` — LangGraph / LangChain (``pip install
  'sluice-sdk[langgraph]'``): ``StructuredTool``\\ s; approval is LangGraph's ``interrupt``,
  resumed with ``Command(resume=...)``.

Both import their framework only when imported themselves. What they share is here and in
``_calls``: one journal position per tool call of the framework (by its call id), so a call
re-executed by the framework (a resumed graph node, an approved call) keeps its key, and an
agent re-run from the start with the same run id and the same calls gets the same keys and the
stored results.

Who approves: Sluice's approval is given only by a person whose token may approve (``sluice
approve``, the console); the adapters never turn a framework-side "approve" into one, they wait
on Sluice's. docs/decisions.md ("Agent framework adapters") says why.
"""

from ._calls import Pending, framework_name, tool_of

__all__ = ["Pending", "framework_name", "tool_of"]

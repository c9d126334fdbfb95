"""The LangGraph adapter (sluice.adapters.langgraph) in a real LangGraph agent loop (a
`StateGraph` with the prebuilt `ToolNode`, a checkpointer for interrupts): the model is
LangChain's own test double (`GenericFakeChatModel`, scripted to call tools); `sluice dev`, its
ledger and the toolbox upstream are real."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sluice

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command
from test_people import console_line

from sluice.adapters.langgraph import SluiceToolkit

from servers import SluiceDev
from toolbox import World


def scripted(*calls: tuple[str, dict[str, Any]]) -> GenericFakeChatModel:
    """LangChain's test model: one tool call per turn, in order, then a last answer."""
    turns = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}"}])
        for i, (name, args) in enumerate(calls)
    ]
    return GenericFakeChatModel(messages=iter([*turns, AIMessage(content="done")]))


def agent_graph(model: GenericFakeChatModel, tools: list[Any]) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def tool_outputs(state: dict[str, Any]) -> list[Any]:
    return [json.loads(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


def test_a_re_run_graph_gets_the_same_keys_and_the_stored_results(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    calls = (
        ("shop__ticket", {"title": "broken lamp"}),
        ("shop__notify", {"to": "ann@example.com", "text": "ticket opened"}),
        ("shop__ticket", {"title": "second lamp"}),
    )
    before = world.calls["shop/ticket"]
    states, keys = [], []
    for _ in range(2):
        with client.run(run_id) as run:
            tools = SluiceToolkit(run).get("shop/ticket", "shop/notify")
            graph = agent_graph(scripted(*calls), tools)
            states.append(
                graph.invoke(
                    {"messages": [("user", "two tickets")]}, {"configurable": {"thread_id": "t"}}
                )
            )
            keys.append([(e.command_key, e.idempotency_key, e.status) for e in run.effects()])
    assert keys[0] == keys[1], keys
    assert sorted(k for k, _, _ in keys[0]) == [
        "d-1/shop/notify/0",
        "d-1/shop/ticket/0",
        "d-1/shop/ticket/1",
    ]
    assert {status for _, _, status in keys[0]} == {"CONFIRMED"}
    assert tool_outputs(states[0]) == tool_outputs(states[1])
    assert tool_outputs(states[0])[0]["title"] == "broken lamp"
    assert world.calls["shop/ticket"] == before + 2
    assert states[1]["messages"][-1].content == "done"


def test_approval_is_langgraphs_interrupt_and_sluices_approval_runs_it(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]
    config = {"configurable": {"thread_id": run_id}}
    with client.run(run_id) as run:
        toolkit = SluiceToolkit(run, approval_wait=20)
        graph = agent_graph(
            scripted(
                ("shop__refund", {"order": "o-1", "amount_minor": 500}),
                ("shop__refund", {"order": "o-2", "amount_minor": 700}),
            ),
            toolkit.get("shop/refund"),
        )
        state = graph.invoke({"messages": [("user", "refund o-1 and o-2")]}, config)
        [paused] = state["__interrupt__"]
        pending = paused.value["sluice"]
        assert (pending["command_key"], pending["status"]) == ("d-1/shop/refund/0", "BLOCKED")
        assert world.calls["shop/refund"] == before  # nothing ran
        # A person approves in Sluice; the application resumes the graph.
        done = server.console(*console_line(pending["remedy"], "sluice approve"))
        assert done.returncode == 0, done.stderr
        state = graph.invoke(Command(resume={"approved": True}), config)
        # The second refund: the application's person rejects it, so Sluice never runs it.
        [paused] = state["__interrupt__"]
        assert paused.value["sluice"]["command_key"] == "d-1/shop/refund/1"
        state = graph.invoke(
            Command(resume={"approved": False, "reason": "duplicate order"}), config
        )
        effects = [(e.command_key, e.status) for e in run.effects()]
    first, second = tool_outputs(state)
    assert first["order"] == "o-1" and first["id"].startswith("rf-")
    assert second == {"status": "CANCELLED", "message": "rejected: duplicate order"}
    assert effects == [("d-1/shop/refund/0", "CONFIRMED"), ("d-1/shop/refund/1", "CANCELLED")]
    assert world.calls["shop/refund"] == before + 1
    assert "__interrupt__" not in state and state["messages"][-1].content == "done"


def test_resumed_before_sluices_decision_the_graph_is_interrupted_again(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]
    config = {"configurable": {"thread_id": run_id}}
    with client.run(run_id) as run:
        toolkit = SluiceToolkit(run, approval_wait=0.3)
        graph = agent_graph(
            scripted(("shop__refund", {"order": "o-3", "amount_minor": 300})),
            toolkit.get("shop/refund"),
        )
        state = graph.invoke({"messages": [("user", "refund o-3")]}, config)
        [paused] = state["__interrupt__"]
        # The application says yes, but nobody decided in Sluice: the graph stops again.
        state = graph.invoke(Command(resume={"approved": True}), config)
        [again] = state["__interrupt__"]
        assert again.value["sluice"]["command_key"] == paused.value["sluice"]["command_key"]
        assert world.calls["shop/refund"] == before
        done = server.console(*console_line(again.value["sluice"]["remedy"], "sluice approve"))
        assert done.returncode == 0, done.stderr
        state = graph.invoke(Command(resume={"approved": True}), config)
        effects = [(e.command_key, e.status) for e in run.effects()]
    [refund] = tool_outputs(state)
    assert refund["order"] == "o-3"
    assert effects == [("d-1/shop/refund/0", "CONFIRMED")]
    assert world.calls["shop/refund"] == before + 1

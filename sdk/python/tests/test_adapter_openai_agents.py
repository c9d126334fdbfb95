"""The OpenAI Agents SDK adapter (sluice.adapters.openai_agents) driving a real agent loop: the
model is the SDK's own test double (`agents.testing.ScriptedModel`, scripted to call tools),
everything else is real: the `Runner`, `sluice dev` with its ledger, and the toolbox upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import sluice

agents = pytest.importorskip("agents")

from agents import Agent, Runner, ToolCallOutputItem, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from test_people import console_line  # noqa: E402

from sluice.adapters.openai_agents import SluiceTools  # noqa: E402

from servers import SluiceDev  # noqa: E402
from toolbox import World  # noqa: E402

# No traces leave the test (the SDK would export them to OpenAI's API).
set_tracing_disabled(True)


def scripted(*calls: tuple[str, dict[str, Any]]) -> ScriptedModel:
    """The SDK's test model: one tool call per turn, in order, then a last answer."""
    steps: list[Any] = [
        [function_call(name, args, call_id=f"call-{i}")] for i, (name, args) in enumerate(calls)
    ]
    return ScriptedModel([*steps, [assistant_message("done")]])


def outputs(result: Any) -> list[Any]:
    return [
        json.loads(item.output) if item.output.startswith(("{", "[")) else item.output
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    ]


async def agent_run(
    server: SluiceDev, run_id: str, model: ScriptedModel, *names: str
) -> tuple[Any, list[sluice.Effect]]:
    async with (
        sluice.AsyncClient(server.url, server.agent_token, wait=30) as client,
        client.run(run_id) as run,
    ):
        tools = SluiceTools(run)
        agent = Agent(name="shop", model=model, tools=await tools.get(*names))
        result = await Runner.run(agent, "notify the customer, then search")
        return result, await run.effects()


def test_a_re_run_agent_gets_the_same_keys_and_the_stored_results(
    server: SluiceDev, run_id: str, world: World
) -> None:
    calls = (
        ("shop__notify", {"to": "ann@example.com", "text": "your order shipped"}),
        ("shop__search", {"query": "returns"}),
        ("shop__notify", {"to": "bob@example.com", "text": "yours too"}),
    )
    before = world.calls["shop/notify"]
    first, effects = asyncio.run(
        agent_run(server, run_id, scripted(*calls), "shop/notify", "shop/search")
    )
    again, effects_again = asyncio.run(
        agent_run(server, run_id, scripted(*calls), "shop/notify", "shop/search")
    )
    assert sorted(e.command_key for e in effects) == [
        "d-1/shop/notify/0",
        "d-1/shop/notify/1",
        "d-1/shop/search/0",
    ]
    assert [e.idempotency_key for e in effects_again] == [e.idempotency_key for e in effects]
    assert all(e.status == "CONFIRMED" for e in effects)
    # Both runs saw the upstream's answers; the upstream sent each notification once.
    assert outputs(first) == outputs(again)
    assert outputs(first)[0]["to"] == "ann@example.com"
    assert outputs(first)[0]["key"] == f"{run_id}/d-1/shop/notify/0"
    assert world.calls["shop/notify"] == before + 2
    assert first.final_output == again.final_output == "done"


def test_a_call_sluice_holds_for_approval_is_the_sdks_interruption_until_a_person_approves(
    server: SluiceDev, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]

    async def scenario() -> tuple[Any, Any]:
        async with (
            sluice.AsyncClient(server.url, server.agent_token, wait=30) as client,
            client.run(run_id) as run,
        ):
            tools = SluiceTools(run)
            model = scripted(("shop__refund", {"order": "o-7", "amount_minor": 900}))
            agent = Agent(name="shop", model=model, tools=await tools.get("shop/refund"))
            result = await Runner.run(agent, "refund order o-7")
            # The SDK's own human-in-the-loop stop, not an error; nothing ran upstream.
            assert [i.tool_name for i in result.interruptions] == ["shop__refund"]
            assert world.calls["shop/refund"] == before
            pending = tools.pending(result.interruptions[0])
            assert pending is not None
            assert (pending.status, pending.command_key) == ("BLOCKED", "d-1/shop/refund/0")
            state = result.to_state()
            # Nobody decided yet: it stays pending, the SDK's state untouched.
            assert [p.command_key for p in await tools.settle(state, timeout=0.5)] == [
                "d-1/shop/refund/0"
            ]
            # A person with an approver's token approves in Sluice, as the remedy says.
            done = server.console(*console_line(pending.remedy, "sluice approve"))
            assert done.returncode == 0, done.stderr
            assert await tools.settle(state, timeout=20) == []
            resumed = await Runner.run(agent, state)
            return resumed, await run.effects()

    resumed, effects = asyncio.run(scenario())
    [refund] = outputs(resumed)
    assert refund["order"] == "o-7" and refund["id"].startswith("rf-")
    assert [(e.command_key, e.status) for e in effects] == [("d-1/shop/refund/0", "CONFIRMED")]
    assert world.calls["shop/refund"] == before + 1
    assert resumed.final_output == "done"


def test_rejected_in_the_sdk_or_in_sluice_nothing_runs(
    server: SluiceDev, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]

    async def scenario() -> tuple[list[Any], list[sluice.Effect]]:
        async with (
            sluice.AsyncClient(server.url, server.agent_token, wait=30) as client,
            client.run(run_id) as run,
        ):
            tools = SluiceTools(run)
            model = scripted(
                ("shop__refund", {"order": "o-8", "amount_minor": 100}),
                ("shop__refund", {"order": "o-9", "amount_minor": 200}),
            )
            agent = Agent(name="shop", model=model, tools=await tools.get("shop/refund"))
            seen: list[Any] = []
            result = await Runner.run(agent, "refund two orders")
            # The application's person says no: rejected in the SDK, removed from Sluice.
            state = result.to_state()
            await tools.reject(state, result.interruptions[0], "not a refundable order")
            result = await Runner.run(agent, state)
            seen += outputs(result)
            # The second is rejected in Sluice by a person; settle mirrors it.
            pending = tools.pending(result.interruptions[0])
            assert pending is not None
            done = server.console(*console_line(pending.remedy, "sluice reject"))
            assert done.returncode == 0, done.stderr
            state = result.to_state()
            assert await tools.settle(state, timeout=20) == []
            result = await Runner.run(agent, state)
            seen += outputs(result)
            return seen, await run.effects()

    seen, effects = asyncio.run(scenario())
    assert [(e.command_key, e.status) for e in effects] == [
        ("d-1/shop/refund/0", "CANCELLED"),
        ("d-1/shop/refund/1", "CANCELLED"),
    ]
    assert any("not a refundable order" in str(output) for output in seen)
    assert any("CANCELLED in Sluice" in str(output) for output in seen)
    assert world.calls["shop/refund"] == before


def test_approved_only_in_the_sdk_the_call_still_waits_for_sluice_and_the_model_is_told(
    server: SluiceDev, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]

    async def scenario() -> tuple[list[Any], list[sluice.Effect]]:
        async with (
            sluice.AsyncClient(server.url, server.agent_token, wait=30) as client,
            client.run(run_id) as run,
        ):
            tools = SluiceTools(run, approval_wait=0.3)
            model = scripted(("shop__refund", {"order": "o-5", "amount_minor": 50}))
            agent = Agent(name="shop", model=model, tools=await tools.get("shop/refund"))
            result = await Runner.run(agent, "refund o-5")
            state = result.to_state()
            state.approve(result.interruptions[0])  # the application's "yes", not Sluice's
            result = await Runner.run(agent, state)
            return outputs(result), await run.effects()

    seen, effects = asyncio.run(scenario())
    [told] = seen
    assert told["status"] == "BLOCKED" and told["command_key"] == "d-1/shop/refund/0"
    assert "sluice approve" in told["remedy"]
    assert [(e.command_key, e.status) for e in effects] == [("d-1/shop/refund/0", "BLOCKED")]
    assert world.calls["shop/refund"] == before


def test_calls_of_one_turn_take_positions_in_the_models_order(
    server: SluiceDev, run_id: str, world: World
) -> None:
    # The SDK runs a turn's tool calls concurrently: each takes its position as it starts, in
    # the order the model gave them, so a re-run gets the same key for the same call.
    notes = [("ann@example.com", "one"), ("bob@example.com", "two"), ("cy@example.com", "three")]
    turn = [
        function_call("shop__notify", {"to": to, "text": text}, call_id=f"call-{i}")
        for i, (to, text) in enumerate(notes)
    ]

    async def drive() -> list[sluice.Effect]:
        async with (
            sluice.AsyncClient(server.url, server.agent_token, wait=30) as client,
            client.run(run_id) as run,
        ):
            tools = SluiceTools(run)
            model = ScriptedModel([turn, [assistant_message("done")]])
            agent = Agent(name="shop", model=model, tools=await tools.get("shop/notify"))
            await Runner.run(agent, "notify three people")
            return await run.effects()

    before = world.calls["shop/notify"]
    for _ in range(2):
        effects = sorted(asyncio.run(drive()), key=lambda e: e.command_key)
        assert [(e.command_key, e.args["to"], e.status) for e in effects] == [
            (f"d-1/shop/notify/{i}", to, "CONFIRMED") for i, (to, _) in enumerate(notes)
        ]
    assert world.calls["shop/notify"] == before + 3

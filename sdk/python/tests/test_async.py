"""The asyncio client against the same server: decorated async effects, concurrency, re-drive,
typed outcomes and rollback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sluice

from servers import SluiceDev
from toolbox import World


@sluice.effect(tool="shop/notify")
async def notify(to: str, text: str) -> dict[str, Any]:
    return {"to": to, "text": text}


@sluice.effect(tool="ticket")  # bare: the server's default namespace
async def ticket(title: str) -> dict[str, Any]:
    return {"title": title}


@sluice.effect(tool="shop/refund")
async def refund(order: str) -> dict[str, Any]:
    return {"order": order, "amount_minor": 1}


async def agent(client: sluice.AsyncClient, run_id: str) -> list[Any]:
    async with client.run(run_id) as run:
        opened = await asyncio.gather(ticket("a"), ticket("b"), ticket("c"))
        run.decide()
        told = await notify("ops@example.com", ", ".join(t["id"] for t in opened))
        return [*opened, told]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_re_driven_async_agent_gets_the_same_keys_and_results(
    server: SluiceDev, run_id: str, world: World
) -> None:
    before = world.calls["shop/ticket"]
    async with sluice.AsyncClient(server.url, server.agent_token, wait=30) as client:
        first = await agent(client, run_id)
        second = await agent(client, run_id)
        effects = await client.run(run_id).effects()
    assert second == first
    assert [t["title"] for t in first[:3]] == ["a", "b", "c"]
    assert [e.command_key for e in effects] == [
        "d-1/shop/ticket/0",
        "d-1/shop/ticket/1",
        "d-1/shop/ticket/2",
        "d-2/shop/notify/0",
    ]
    assert [e.args["title"] for e in effects[:3]] == ["a", "b", "c"]
    assert world.calls["shop/ticket"] - before == 3


@pytest.mark.anyio
async def test_async_outcomes_and_rollback(server: SluiceDev, run_id: str, world: World) -> None:
    client = sluice.AsyncClient(server.url, server.agent_token, wait=30)
    async with client, client.run(run_id) as run:
        opened = await ticket("to undo")
        with pytest.raises(sluice.AwaitingApproval) as blocked:
            await refund("o-9")
        assert blocked.value.command_key == "d-1/shop/refund/0"
        scheduled = await run.schedule_effect(
            "shop/notify", {"to": "a@example.com", "text": "x"}, delay=600
        )
        assert [e.command_key for e in await run.get_scheduled_effects()] == [scheduled.command_key]
        await run.rollback("the async agent gave up")
        progress = await run.wait_rolled_back(timeout=30)
        statuses = {e.command_key: e.status for e in await run.effects()}
    assert [step.command_key for step in progress.commands] == ["d-1/shop/ticket/0"]
    # Compensated if it ran; cancelled if it had not started (awaiting approval, scheduled).
    assert statuses == {
        "d-1/shop/ticket/0": "COMPENSATED",
        "d-1/shop/refund/0": "CANCELLED",
        scheduled.command_key: "CANCELLED",
    }
    assert world.tickets[opened["id"]]["open"] is False


@pytest.mark.anyio
async def test_an_async_effect_needs_an_async_run(client: sluice.Client, run_id: str) -> None:
    with (
        client.run(run_id),
        pytest.raises(sluice.NoActiveRun, match="needs a run of an AsyncClient"),
    ):
        await notify("a@example.com", "x")


@pytest.mark.anyio
async def test_decoration_time_checks_with_an_async_client(server: SluiceDev) -> None:
    async with sluice.AsyncClient(server.url, server.agent_token) as client:
        with pytest.raises(sluice.DeclarationError, match="outbox_tool"):

            @sluice.effect(tool="bank/wire", client=client)
            async def wire() -> dict[str, Any]:
                return {}

"""Effects through a real `sluice dev`: the journal, re-driving, drift and refusals."""

from __future__ import annotations

from typing import Any

import pytest

import sluice

from servers import SluiceDev
from toolbox import World


@sluice.effect(tool="shop/notify")
def notify(to: str, text: str) -> dict[str, Any]:
    return {"to": to, "text": text}


@sluice.effect(tool="search")  # a bare name, in the server's default namespace (shop)
def search(query: str) -> dict[str, Any]:
    return {"query": query}


@sluice.outbox_tool(tool="bank/wire")
def wire(account: str, amount_minor: int, memo: str = "invoice-1") -> dict[str, Any]:
    return {"account": account, "amount_minor": amount_minor, "memo": memo}


def agent(client: sluice.Client, run_id: str, amount_minor: int = 5000) -> list[Any]:
    """A small agent: look up, pay, tell, in two decisions."""
    with client.run(run_id) as run:
        hits = search("refund policy")
        paid = wire("acc-1", amount_minor, memo=run_id)
        run.decide()
        told = notify("ops@example.com", f"paid {paid['id']}")
        again = notify("ceo@example.com", "done")
        return [hits, paid, told, again]


def test_a_re_driven_agent_gets_the_same_keys_and_results(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    before = dict(world.calls)
    first = agent(client, run_id)
    keys = [e.command_key for e in client.run(run_id).effects()]
    assert keys == [
        "d-1/bank/wire/0",
        "d-1/shop/search/0",
        "d-2/shop/notify/0",
        "d-2/shop/notify/1",
    ]
    assert first[2]["key"] == f"{run_id}/d-2/shop/notify/0"
    # Re-driven from the start, by a new process (a new client): same keys, stored results,
    # and no tool ran again.
    with sluice.Client(server.url, server.agent_token) as restarted:
        second = agent(restarted, run_id)
    assert second == first
    for tool, n in (("shop/search", 1), ("bank/wire", 1), ("shop/notify", 2)):
        assert world.calls[tool] - before.get(tool, 0) == n, tool
    effects = client.run(run_id).effects()
    assert [e.status for e in effects] == ["CONFIRMED"] * 4
    assert effects[0].external_ref == first[1]["id"]
    assert effects[0].idempotency_key == f"{run_id}/d-1/bank/wire/0"


def test_argument_drift_names_the_position_and_what_to_do(
    client: sluice.Client, run_id: str
) -> None:
    agent(client, run_id, amount_minor=5000)
    with pytest.raises(sluice.ArgumentDrift) as drift:
        agent(client, run_id, amount_minor=7000)
    error = drift.value
    assert (error.status_code, error.code) == (409, "argument_drift")
    assert (error.run_id, error.command_key) == (run_id, "d-1/bank/wire/0")
    assert "run.decide()" in str(error) and "same order" in str(error)


def test_a_business_key_already_held_returns_the_holder_instead_of_a_second_wire(
    client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["bank/wire"]
    with client.run(run_id) as first:
        held = first.call("bank/wire", {"account": "acc-9", "amount_minor": 10, "memo": run_id})
    with client.run(run_id + "-again") as second:
        again = second.call("bank/wire", {"account": "acc-9", "amount_minor": 10, "memo": run_id})
    assert (again.run_id, again.command_key) == (run_id, held.command_key)
    assert again.result == held.result
    # The answer says it is another run's command, found by the business key.
    assert held.existing is None and not held.found_by_business_key
    assert again.existing == "business_key" and again.found_by_business_key
    with client.run(run_id) as redriven:
        repeated = redriven.call(
            "bank/wire", {"account": "acc-9", "amount_minor": 10, "memo": run_id}
        )
    assert repeated.existing == "command_key"
    assert world.calls["bank/wire"] - before == 1


def test_a_new_decision_is_a_new_effect(client: sluice.Client, run_id: str) -> None:
    with client.run(run_id) as run:
        first = run.call("shop/notify", {"to": "a@example.com", "text": "one"})
        run.decide()
        second = run.call("shop/notify", {"to": "a@example.com", "text": "one"})
    assert (first.command_key, second.command_key) == ("d-1/shop/notify/0", "d-2/shop/notify/0")
    assert first.result["id"] != second.result["id"]


def test_a_refused_effect_raises_failed_with_the_replay_command(
    client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id), pytest.raises(sluice.EffectFailed) as failed:
        wire("acc-1", 0)
    error = failed.value
    assert (error.status, error.run_id, error.command_key) == ("FAILED", run_id, "d-1/bank/wire/0")
    assert "amount_minor must be positive" in str(error)
    assert f"sluice replay {run_id} d-1/bank/wire/0" in error.remedy


def test_refusals_are_typed(server: SluiceDev, client: sluice.Client, run_id: str) -> None:
    with client.run(run_id) as run:
        with pytest.raises(sluice.NotFound) as unknown:
            run.call("shop/teleport", {})
        assert unknown.value.code == "unknown_tool"
        with pytest.raises(sluice.InvalidRequest) as invalid:
            run.call("shop/notify", {"to": "x"})
        assert invalid.value.violations, invalid.value.details
    with sluice.Client(server.url, "not-a-token-at-all") as stranger:
        with pytest.raises(sluice.Unauthorized) as denied:
            stranger.run(run_id).call("shop/notify", {"to": "a", "text": "b"})
        assert "token" in denied.value.hint
    # The agent may not act in another agent's run: the admin's run here.
    with sluice.Client(server.url, server.admin_token) as admin:
        admin.run(run_id + "-admin").call("shop/notify", {"to": "a@example.com", "text": "b"})
    with pytest.raises(sluice.Forbidden):
        client.run(run_id + "-admin").call("shop/notify", {"to": "a@example.com", "text": "c"})


def test_calls_outside_a_run_are_refused_before_anything_runs(world: World) -> None:
    before = world.calls["shop/notify"]
    with pytest.raises(sluice.NoActiveRun, match=r"client\.run"):
        notify("a@example.com", "hello")
    assert world.calls["shop/notify"] == before

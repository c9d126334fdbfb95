"""Outcomes that wait for a person — BLOCKED for approval, STUCK without evidence — surface as
their exceptions, whose remedies are console command lines that work as printed."""

from __future__ import annotations

import shlex
from typing import Any

import httpx
import pytest

import sluice

from servers import SluiceDev
from toolbox import World


@sluice.effect(tool="shop/refund")
def refund(order: str, amount_minor: int) -> dict[str, Any]:
    return {"order": order, "amount_minor": amount_minor}


@sluice.outbox_tool(tool="bank/flaky")
def flaky(ref: str) -> dict[str, Any]:
    return {"ref": ref}


def console_line(remedy: str, start: str) -> list[str]:
    """The `sluice …` command of a remedy that begins with `start`, as a person would copy it."""
    for quoted in remedy.split("`")[1::2]:
        if quoted.startswith(start):
            return shlex.split(quoted.replace('"..."', '"checked by the test"'))[1:]
    raise AssertionError(f"no `{start}` in {remedy!r}")


def test_awaiting_approval_then_approved_returns_the_result_on_re_drive(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["shop/refund"]
    with client.run(run_id), pytest.raises(sluice.AwaitingApproval) as blocked:
        refund("o-1", 2500)
    error = blocked.value
    assert (error.status, error.run_id, error.command_key) == (
        "BLOCKED",
        run_id,
        "d-1/shop/refund/0",
    )
    assert world.calls["shop/refund"] == before  # nothing ran
    approve = console_line(error.remedy, "sluice approve")
    assert approve[:3] == ["approve", run_id, "d-1/shop/refund/0"]
    done = server.console(*approve)
    assert done.returncode == 0, done.stderr
    with client.run(run_id):
        result = refund("o-1", 2500)  # re-driven: the same position, now approved
    assert result["order"] == "o-1" and result["id"].startswith("rf-")
    assert world.calls["shop/refund"] == before + 1


def test_waiting_for_an_approval_in_the_same_run(
    server: SluiceDev, client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id) as run:
        with pytest.raises(sluice.AwaitingApproval) as blocked:
            run.call("shop/refund", {"order": "o-2", "amount_minor": 10})
        server.console(*console_line(blocked.value.remedy, "sluice reject"))
        with pytest.raises(sluice.EffectCancelled) as rejected:
            run.wait(blocked.value.command_key, timeout=10)
    assert rejected.value.status == "CANCELLED"
    # Who rejected it and why reach the agent, in the exception and its message.
    rejection = rejected.value.rejection
    assert rejection is not None
    assert rejection.reason == "checked by the test"
    assert rejection.by == "test-admin"
    assert "rejected it: checked by the test" in str(rejected.value)


def test_a_stuck_effect_surfaces_with_the_resolve_command(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["bank/flaky"]
    with client.run(run_id), pytest.raises(sluice.EffectStuck) as stuck:
        flaky("f-1")
    error = stuck.value
    assert (error.status, error.command_key) == ("STUCK", "d-1/bank/flaky/0")
    assert error.effect.escalated
    # Never retried blindly: the bank was called once.
    assert world.calls["bank/flaky"] == before + 1
    resolve = console_line(error.remedy, "sluice resolve")
    assert resolve[:3] == ["resolve", run_id, "d-1/bank/flaky/0"]
    resolve = [arg.replace("<ref>", "w-from-statement") for arg in resolve]
    done = server.console(*resolve)
    assert done.returncode == 0, done.stdout + done.stderr
    # A person confirmed it from the bank statement: the re-driven agent gets on with it.
    with client.run(run_id) as run:
        effect = run.call("bank/flaky", {"ref": "f-1"})
    assert (effect.status, effect.external_ref) == ("CONFIRMED", "w-from-statement")
    assert world.calls["bank/flaky"] == before + 1


def test_an_approval_link_approves_the_blocked_effect_once(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    with client.run(run_id), pytest.raises(sluice.AwaitingApproval) as blocked:
        refund("o-link", 2600)
    key = blocked.value.command_key
    with sluice.Client(server.url, server.admin_token) as admin:
        link = admin.run(run_id).approval_link(key, expires_in=600, recipient="finance@example.com")
    assert link.url.startswith(f"{server.url}/approve/v1."), link
    assert link.recipient == "finance@example.com"
    assert link.url not in repr(link)  # the token stays out of logs
    # An agent may not make one.
    with pytest.raises(sluice.ApiError) as refused:
        client.run(run_id).approval_link(key)
    assert refused.value.status_code == 403
    # The link needs no token: approve through it, then it is spent.
    decided = httpx.post(link.url, json={"decision": "approve", "reason": "refund checked"})
    assert decided.status_code == 200, decided.text
    again = httpx.post(link.url, json={"decision": "approve", "reason": "twice"})
    assert again.status_code == 410 and again.json()["error"]["code"] == "link_used", again.text
    with client.run(run_id):
        result = refund("o-link", 2600)
    assert result["order"] == "o-link"


def test_sluice_approval_link_prints_a_link_that_rejects_once(
    server: SluiceDev, client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id), pytest.raises(sluice.AwaitingApproval) as blocked:
        refund("o-cli-link", 2700)
    key = blocked.value.command_key
    made = server.console("approval-link", run_id, key, "--for", "bob", "--expires-in", "300")
    assert made.returncode == 0, made.stderr
    url, details = made.stdout.strip().splitlines()
    assert url.startswith(f"{server.url}/approve/v1."), made.stdout
    assert details.startswith("link ") and details.endswith(", for bob"), details
    decided = httpx.post(url, json={"decision": "reject", "reason": "not this order"})
    assert decided.status_code == 200, decided.text
    with client.run(run_id), pytest.raises(sluice.EffectCancelled) as cancelled:
        refund("o-cli-link", 2700)
    assert "not this order" in str(cancelled.value)

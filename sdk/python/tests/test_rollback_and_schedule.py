"""An agent rolls back its own run, and schedules, lists and removes effects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import sluice

from toolbox import World


def test_an_agent_rolls_back_its_own_run(client: sluice.Client, run_id: str, world: World) -> None:
    with client.run(run_id) as run:
        first = run.call("shop/ticket", {"title": "first"})
        wire = run.call("bank/wire", {"account": "acc-2", "amount_minor": 99, "memo": run_id})
        run.call("shop/search", {"query": "why"})
        run.decide()
        told = run.call("shop/notify", {"to": "a@example.com", "text": "opened"})
        second = run.call("shop/ticket", {"title": "second"})

        begun = run.rollback("the agent's plan failed")
        progress = run.wait_rolled_back(timeout=30)

    assert begun.run_id == run_id
    assert progress.done
    statuses = {step.command_key: step.status for step in progress.commands}
    assert statuses[first.command_key] == "COMPENSATED"
    assert statuses[second.command_key] == "COMPENSATED"
    assert statuses[wire.command_key] == "COMPENSATED"
    # A sent notification cannot be undone: a person is told.
    assert statuses[told.command_key] == "NO_COMPENSATION"
    assert [step.command_key for step in progress.escalated] == [told.command_key]
    # The upstream's own record: both tickets closed, the wire reversed, last in the journal
    # first (journal order is decision, then tool, then call index: d-1/bank/wire/0 comes
    # before d-1/shop/ticket/0).
    refs = [first.external_ref, second.external_ref]
    assert all(not world.tickets[ref]["open"] for ref in refs if ref)
    assert world.wires[wire.external_ref or ""]["standing"] is False
    undone = [ref for _, ref, _ in world.compensations if ref in (*refs, wire.external_ref)]
    assert undone == [second.external_ref, first.external_ref, wire.external_ref]
    assert ("shop/ticket", first.external_ref, first.idempotency_key) in world.compensations

    with client.run(run_id) as run:
        # Re-driven, the first effect reports that it was undone...
        with pytest.raises(sluice.EffectRolledBack) as undone_error:
            run.call("shop/ticket", {"title": "first"})
        assert undone_error.value.status == "COMPENSATED"
        assert f"sluice rollback {run_id}" in undone_error.value.remedy
        # ...and the run takes no new effect.
        run.decide()
        run.decide()
        with pytest.raises(sluice.RunRolledBack) as closed:
            run.call("shop/notify", {"to": "a@example.com", "text": "more"})
    assert "new run" in closed.value.hint


def test_scheduled_effects_are_listed_and_removed(client: sluice.Client, run_id: str) -> None:
    with client.run(run_id) as run:
        later = run.schedule_effect(
            "shop/notify", {"to": "a@example.com", "text": "later"}, delay=3600
        )
        at = datetime.now(UTC) + timedelta(hours=2)
        much_later = run.schedule_effect("shop/ticket", {"title": "review"}, at=at)
        assert (later.status, later.command_key) == ("SCHEDULED", "d-1/shop/notify/0")
        assert much_later.not_before is not None and much_later.not_before.startswith(
            at.strftime("%Y-%m-%dT%H:%M")
        )
        listed = run.get_scheduled_effects()
        assert [e.command_key for e in listed] == [later.command_key, much_later.command_key]
        assert [e.command_key for e in run.get_scheduled_effects(tool="shop/ticket")] == [
            much_later.command_key
        ]

        removed = run.remove_scheduled_effect(later.command_key, reason="not needed after all")
        assert removed.status == "CANCELLED"
        assert [e.command_key for e in run.get_scheduled_effects()] == [much_later.command_key]
        with pytest.raises(sluice.EffectCancelled):
            run.wait(later)


def test_a_scheduled_effect_runs_when_due_and_can_no_longer_be_removed(
    client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id) as run:
        soon = run.schedule_effect(
            "shop/notify", {"to": "b@example.com", "text": "soon"}, delay=0.5
        )
        assert soon.status == "SCHEDULED"
        done = run.wait(soon, timeout=20)
        assert done.status == "CONFIRMED" and done.result["text"] == "soon"
        with pytest.raises(sluice.Conflict) as started:
            run.remove_scheduled_effect(soon)
        assert "CONFIRMED" in started.value.hint

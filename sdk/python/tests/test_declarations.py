"""Decorated tools are checked against the server's catalog (GET /v1/tools) before anything is
recorded: at decoration with a client, else at the first call in a run (first bind)."""

from __future__ import annotations

from typing import Any

import pytest

import sluice

from servers import SluiceDev
from toolbox import World


def intent() -> dict[str, Any]:
    return {}


def test_effect_on_a_non_idempotent_tool_is_refused_at_decoration(client: sluice.Client) -> None:
    with pytest.raises(sluice.DeclarationError) as refused:
        sluice.effect(tool="bank/wire", client=client)(intent)
    message = str(refused.value)
    assert "NON_IDEMPOTENT" in message and "@sluice.outbox_tool(tool='bank/wire')" in message


def test_an_outbox_tool_the_server_does_not_know_is_refused(client: sluice.Client) -> None:
    with pytest.raises(sluice.DeclarationError) as refused:
        sluice.outbox_tool(tool="bank/teleport", client=client)(intent)
    message = str(refused.value)
    assert "no tool 'bank/teleport'" in message and "bank/wire" in message
    assert "catalog" in message


def test_an_outbox_tool_declared_idempotent_by_the_server_is_refused(client: sluice.Client) -> None:
    with pytest.raises(sluice.DeclarationError, match=r"IDEMPOTENT.*@sluice\.effect"):
        sluice.outbox_tool(tool="shop/notify", client=client)(intent)


def test_an_outbox_tool_nothing_can_resolve_needs_allow_unsafe(client: sluice.Client) -> None:
    with pytest.raises(sluice.DeclarationError, match="no business key, no status check"):
        sluice.outbox_tool(tool="bank/unsafe", client=client)(intent)
    declared = sluice.outbox_tool(tool="bank/unsafe", client=client, allow_unsafe=True)(intent)
    assert declared.declaration.allow_unsafe


def test_matching_declarations_pass(client: sluice.Client) -> None:
    sluice.outbox_tool(tool="bank/wire", client=client)(intent)
    sluice.effect(tool="shop/notify", client=client)(intent)
    sluice.effect(tool="search", client=client)(intent)  # bare: the default namespace


def test_invalid_names_are_refused_without_a_server() -> None:
    with pytest.raises(sluice.DeclarationError, match="snake_case"):
        sluice.effect(tool="Shop/notify")(intent)


def test_without_a_client_the_check_runs_at_first_bind_before_anything_is_recorded(
    server: SluiceDev, client: sluice.Client, run_id: str, world: World
) -> None:
    @sluice.effect(tool="bank/wire")
    def sneaky(account: str) -> dict[str, Any]:
        return {"account": account, "amount_minor": 1, "memo": run_id}

    before = world.calls["bank/wire"]
    with client.run(run_id), pytest.raises(sluice.DeclarationError, match="outbox_tool"):
        sneaky("acc-1")
    with sluice.Client(server.url, server.admin_token) as admin:
        assert admin.run(run_id).effects() == []
    assert world.calls["bank/wire"] == before


def test_an_intent_must_be_the_arguments(client: sluice.Client, run_id: str) -> None:
    @sluice.effect(tool="shop/notify")
    def wrong() -> Any:
        return ["not", "a", "dict"]

    with client.run(run_id), pytest.raises(TypeError, match="must return the effect's arguments"):
        wrong()

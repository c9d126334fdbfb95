"""Tenants against a real `sluice dev`: a run's effects are recorded under the token's own
tenant, or the one the run names; a tenant over its quota of effects in flight is refused with
:class:`sluice.OverQuota`, nothing recorded, saying when to come back."""

from __future__ import annotations

import pytest

import sluice

from servers import SluiceDev


def test_effects_are_recorded_under_the_token_or_the_named_tenant(
    client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id) as run:
        own = run.call("shop/notify", {"to": "a@example.com", "text": "own"})
    assert own.tenant == "test-agent"
    with client.run(run_id + "-acme", tenant="acme") as run:
        assert run.tenant == "acme"
        named = run.call("shop/notify", {"to": "a@example.com", "text": "for acme"})
    assert named.tenant == "acme" and named.status == "CONFIRMED"


def test_a_tenant_the_token_may_not_name_is_forbidden(client: sluice.Client, run_id: str) -> None:
    with client.run(run_id, tenant="initech") as run, pytest.raises(sluice.Forbidden) as refused:
        run.call("shop/notify", {"to": "a@example.com", "text": "not ours"})
    assert "initech" in refused.value.message


def test_a_tenant_over_its_quota_is_refused_with_when_to_come_back(
    server: SluiceDev, client: sluice.Client, run_id: str
) -> None:
    with client.run(run_id, tenant="closed") as run, pytest.raises(sluice.OverQuota) as refused:
        run.call("shop/notify", {"to": "a@example.com", "text": "over quota"})
    over = refused.value
    assert (over.status_code, over.code) == (429, "tenant_over_quota")
    assert (over.tenant, over.quota, over.in_flight, over.retry_after) == ("closed", 0, 0, 2.0)
    assert "after 2 s" in over.hint
    # Nothing was recorded: the run holds no effect.
    with sluice.Client(server.url, server.admin_token) as admin:
        assert admin.run(run_id).effects() == []

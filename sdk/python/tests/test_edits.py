"""Edit and approve through the SDK, against a real `sluice dev` whose catalog puts the refunds
under a spend budget: an approver's edit comes back to the agent as a revision (it ran with the
edited arguments, under the same key), and an amount past the budget is a BudgetExceeded with
the budget's figures — for a submission and for an edit alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import sluice

import toolbox
from servers import AppServer, SluiceDev

MONEY = '\n[tool.money.amount_minor]\ncurrency = "EUR"\nminor_units = 2\n'
BUDGET = """
[budgets.refunds]
tools = ["shop/refund"]
scope = "run"
window = "total"
limits = { EUR = 10000 }
on_exceed = "deny"
"""


@pytest.fixture(scope="module")
def budgeted(
    tools_server: AppServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceDev]:
    text = toolbox.catalog(tools_server.url)
    marker = "requires_approval = true\n"
    at = text.index(marker, text.index('name = "shop/refund"')) + len(marker)
    text = text[:at] + MONEY + text[at:] + BUDGET
    with SluiceDev(tmp_path_factory.mktemp("budgeted"), text) as dev:
        yield dev


def test_an_edit_reaches_the_agent_and_budgets_refuse_with_their_figures(
    budgeted: SluiceDev, run_id: str
) -> None:
    agent = sluice.Client(budgeted.url, budgeted.agent_token, wait=30)
    admin = sluice.Client(budgeted.url, budgeted.admin_token, wait=30)
    with agent, admin:
        with agent.run(run_id) as run:
            with pytest.raises(sluice.AwaitingApproval) as blocked:
                run.call("shop/refund", {"order": "o-1", "amount_minor": 8000})
            key = blocked.value.command_key
            # 8,000 of 10,000 held: 3,000 more would pass the budget; nothing is recorded.
            with pytest.raises(sluice.BudgetExceeded) as over:
                run.call("shop/refund", {"order": "o-2", "amount_minor": 3000})
        error = over.value
        assert isinstance(error, sluice.Conflict)
        assert (error.budget, error.currency, error.limit, error.spent, error.amount) == (
            "refunds",
            "EUR",
            10000,
            8000,
            3000,
        )
        approver = admin.run(run_id)
        # An edit past the budget is refused the same way, and changes nothing.
        with pytest.raises(sluice.BudgetExceeded) as too_much:
            approver.approve(key, "more", args={"order": "o-1", "amount_minor": 12000})
        assert (too_much.value.spent, too_much.value.amount) == (0, 12000)
        assert approver.get(key).status == "BLOCKED"
        # A schema violation names the pointer.
        with pytest.raises(sluice.InvalidRequest) as invalid:
            approver.approve(key, "typo", args={"order": "o-1", "amount_minor": "60"})
        assert invalid.value.violations[0]["pointer"] == "/args/amount_minor"
        # The edit: 6,000. A revision of the same effect, by the admin, with why.
        approved = approver.approve(
            key, "the order was 60.00", args={"order": "o-1", "amount_minor": 6000}
        )
        assert approved.status == "APPROVED"
        (revision,) = approved.revisions
        assert (revision.number, revision.by, revision.reason) == (
            1,
            "test-admin",
            "the order was 60.00",
        )
        assert revision.changes == [
            {"pointer": "/amount_minor", "kind": "changed", "old": 8000, "new": 6000}
        ]
        assert approved.args["amount_minor"] == 8000  # as submitted
        assert approved.current_args["amount_minor"] == 6000
        # The agent, re-driven with what it first submitted: the edited effect, not a drift.
        with agent.run(run_id) as run:
            done = run.call("shop/refund", {"order": "o-1", "amount_minor": 8000})
            assert done.status == "CONFIRMED"
            assert done.result["amount_minor"] == 6000  # the tool ran with the edit
            assert [r.reason for r in done.revisions] == ["the order was 60.00"]
            # The room the edit gave back: 3,000 fits now (and waits for its approval).
            with pytest.raises(sluice.AwaitingApproval):
                run.call("shop/refund", {"order": "o-2", "amount_minor": 3000})

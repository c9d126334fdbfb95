"""sluice.tool.ToolApp on the wire, served by uvicorn: replays from the idempotency store,
status by business key, compensation, refusals at decoration, and the catalog it prints."""

from __future__ import annotations

import subprocess
import sys
import threading
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import sluice
from sluice.tool import Call, MemoryStore, Refused, SQLiteStore, ToolApp

import toolbox
from servers import AppServer
from signed import KEY, get, post


def headers(key: str, business_key: str | None = None, **extra: str) -> dict[str, str]:
    sent = {
        "idempotency-key": key,
        "x-sluice-run-id": "r-1",
        "x-sluice-command-key": "d-1/pay/out/0",
    }
    if business_key is not None:
        sent["x-sluice-business-key"] = business_key
    return {**sent, **extra}


def payments(store: Any, calls: Counter[str], gate: threading.Event | None = None) -> ToolApp:
    """A payout tool whose lookups come from the store (no status function)."""
    app = ToolApp(store=store, signing_keys=[KEY])

    def undo(external_ref: str, args: dict[str, Any], call: Call) -> dict[str, Any]:
        calls["undo"] += 1
        if external_ref == "never":
            raise Refused("payouts to the tax office cannot be reversed", status=409)
        return {"id": f"rev-{external_ref}", "undid": call.dispatch_idempotency_key, "args": args}

    @app.tool(
        "pay/out", semantics=sluice.NON_IDEMPOTENT, business_key="{to}:{amount}", compensate=undo
    )
    def payout(to: str, amount: int) -> dict[str, Any]:
        """Pay someone"""
        calls["payout"] += 1
        if gate is not None:
            gate.wait(10)
        if amount < 0:
            raise Refused("amount must not be negative")
        if to == "flaky":
            raise ConnectionError("the bank hung up")
        return {"id": f"p-{calls['payout']}", "to": to, "amount": amount}

    return app


def test_a_replay_gets_the_stored_answer_and_the_function_runs_once() -> None:
    calls: Counter[str] = Counter()
    with AppServer(payments(MemoryStore(), calls)) as tool:
        first = post(f"{tool.url}/pay/out", {"to": "ann", "amount": 5}, headers=headers("k-1"))
        again = post(f"{tool.url}/pay/out", {"amount": 5, "to": "ann"}, headers=headers("k-1"))
        other = post(f"{tool.url}/pay/out", {"to": "ann", "amount": 6}, headers=headers("k-1"))
        refused = [
            post(f"{tool.url}/pay/out", {"to": "bob", "amount": -1}, headers=headers("k-2"))
            for _ in range(2)
        ]
    assert (first.status_code, first.json()) == (201, {"id": "p-1", "to": "ann", "amount": 5})
    assert (again.status_code, again.json()) == (201, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert other.status_code == 422 and "other arguments" in other.json()["error"]
    assert [r.status_code for r in refused] == [422, 422]
    assert calls["payout"] == 2


def test_a_request_while_the_first_runs_is_in_progress_409() -> None:
    calls: Counter[str] = Counter()
    gate = threading.Event()
    with AppServer(payments(MemoryStore(), calls, gate)) as tool, ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            post, f"{tool.url}/pay/out", {"to": "ann", "amount": 5}, headers("k-1"), timeout=20
        )
        while calls["payout"] == 0:
            threading.Event().wait(0.01)
        second = post(f"{tool.url}/pay/out", {"to": "ann", "amount": 5}, headers=headers("k-1"))
        gate.set()
        assert first.result().status_code == 201
    assert second.status_code == 409 and "in progress" in second.json()["error"]
    assert calls["payout"] == 1


def test_status_by_business_key_from_a_durable_store(tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    with AppServer(payments(SQLiteStore(tmp_path / "keys.db"), calls)) as tool:
        lookup = f"{tool.url}/pay/out/by-key/"
        absent = get(lookup + "ann%3A5", headers=headers("k-9"))
        post(f"{tool.url}/pay/out", {"to": "ann", "amount": 5}, headers=headers("k-1", "ann:5"))
        present = get(lookup + "ann%3A5")
        # A second commit under the same business key (another idempotency key): a duplicate.
        post(f"{tool.url}/pay/out", {"to": "ann", "amount": 5}, headers=headers("k-2", "ann:5"))
        duplicate = get(lookup + "ann%3A5")
        # A call that raised may have committed: its lookup proves nothing.
        lost = post(
            f"{tool.url}/pay/out",
            {"to": "flaky", "amount": 1},
            headers=headers("k-3", "flaky:1"),
        )
        unknown = get(lookup + "flaky%3A1")
    assert absent.status_code == 404
    assert (present.status_code, present.json()["id"]) == (200, "p-1")
    assert duplicate.status_code == 409 and duplicate.json()["refs"] == ["p-1", "p-2"]
    assert lost.status_code == 500 and "outcome is unknown" in lost.json()["error"]
    assert unknown.status_code == 503


def test_an_in_memory_store_never_claims_an_effect_is_absent() -> None:
    with AppServer(payments(MemoryStore(), Counter())) as tool:
        answer = get(f"{tool.url}/pay/out/by-key/nobody%3A1")
    assert answer.status_code == 503 and "forgets on restart" in answer.json()["error"]


def test_a_durable_store_answers_replays_after_a_restart(tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    body = {"to": "ann", "amount": 5}
    with AppServer(payments(SQLiteStore(tmp_path / "keys.db"), calls)) as tool:
        first = post(f"{tool.url}/pay/out", body, headers=headers("k-1", "ann:5"))
    with AppServer(payments(SQLiteStore(tmp_path / "keys.db"), calls)) as restarted:
        again = post(f"{restarted.url}/pay/out", body, headers=headers("k-1", "ann:5"))
        present = get(f"{restarted.url}/pay/out/by-key/ann%3A5")
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert present.status_code == 200
    assert calls["payout"] == 1


def test_a_call_that_raised_runs_again_under_its_key() -> None:
    calls: Counter[str] = Counter()
    with AppServer(payments(MemoryStore(), calls)) as tool:
        answers = [
            post(
                f"{tool.url}/pay/out", {"to": "flaky", "amount": 1}, headers=headers("k-1")
            ).status_code
            for _ in range(2)
        ]
    assert answers == [500, 500] and calls["payout"] == 2


def test_compensate_is_deduplicated_by_its_own_key() -> None:
    calls: Counter[str] = Counter()
    undo_headers = headers("k-1/compensate", **{"x-sluice-dispatch-idempotency-key": "k-1"})
    body = {"args": {"to": "ann", "amount": 5}, "external_ref": "p-1"}
    with AppServer(payments(MemoryStore(), calls)) as tool:
        undone = [
            post(f"{tool.url}/pay/out/compensate/p-1", body, headers=undo_headers) for _ in range(2)
        ]
        impossible = post(
            f"{tool.url}/pay/out/compensate/never", body, headers=headers("k-2/compensate")
        )
    assert [u.status_code for u in undone] == [200, 200]
    assert undone[0].json() == {"id": "rev-p-1", "undid": "k-1", "args": body["args"]}
    assert undone[1].headers["idempotent-replayed"] == "true"
    assert impossible.status_code == 409
    assert calls["undo"] == 2


def test_unsafe_declarations_are_refused_when_decorated() -> None:
    app = ToolApp(signing_keys=[KEY])

    def send(to: str) -> dict[str, Any]:
        return {"id": to}

    with pytest.raises(sluice.DeclarationError, match="NON_IDEMPOTENT tool needs a way"):
        app.tool("mail/send", semantics=sluice.NON_IDEMPOTENT)(send)
    with pytest.raises(sluice.DeclarationError, match="never compensated"):
        app.tool("mail/peek", semantics=sluice.OBSERVE_ONLY, compensate=send)(send)
    with pytest.raises(sluice.DeclarationError, match="required argument"):
        app.tool("mail/later", semantics=sluice.NON_IDEMPOTENT, business_key="{when}")(send)
    with pytest.raises(sluice.DeclarationError, match="snake_case"):
        app.tool("Mail/send", semantics=sluice.IDEMPOTENT)(send)
    app.tool("mail/send", semantics=sluice.NON_IDEMPOTENT, allow_unsafe=True)(send)
    assert "allow_unsafe = true" in app.catalog_toml("http://127.0.0.1:1")


def test_the_printed_catalog_is_what_the_server_loaded(client: sluice.Client) -> None:
    catalog = tomllib.loads(toolbox.catalog("http://127.0.0.1:9"))
    # The `sluice dev` serving `client` loaded this catalog and signs with KEY from the variable.
    assert catalog["credentials"] == {
        "tool_services": {
            "kind": "standard_webhooks",
            "keys": [{"env": "SLUICE_TOOL_SIGNING_KEYS"}],
        }
    }
    printed = catalog["tool"]
    assert {tool["credential"] for tool in printed} == {"tool_services"}
    wire = next(tool for tool in printed if tool["name"] == "bank/wire")
    assert wire["dispatch"] == {
        "url": "http://127.0.0.1:9/bank/wire",
        "reference_pointer": "/id",
        "in_progress_status": [409],
    }
    assert wire["status_check"] == {
        "url": "http://127.0.0.1:9/bank/wire/by-key/{business_key}",
        "absent_status": [404],
        "duplicate_status": [409],
    }
    assert wire["compensate"]["url"] == "http://127.0.0.1:9/bank/wire/compensate/{external_ref}"
    assert wire["schema"]["required"] == ["account", "amount_minor", "memo"]
    served = client.tools()
    assert [tool["name"] for tool in printed] == list(served.tools)
    for tool in printed:
        described = served.tools[tool["name"]]
        assert described.semantics == tool["semantics"]
        assert described.business_key == tool.get("business_key")
        assert described.status_check == ("status_check" in tool)
        assert described.compensable == ("compensate" in tool)
        assert described.description == tool["description"]
        assert described.args_schema == tool["schema"]
    assert served.tools["shop/refund"].requires_approval
    assert served.get("refund") == served.tools["shop/refund"]  # bare: the default namespace


def test_the_catalog_entries_are_printed_from_the_command_line() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "sluice.tool", "toolbox:app", "http://127.0.0.1:9"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == toolbox.app.catalog_toml("http://127.0.0.1:9")
    assert tomllib.loads(printed.stdout)["tool"][0]["name"] == "shop/notify"

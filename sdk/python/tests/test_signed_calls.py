"""ToolApp serves only calls signed by Sluice (Standard Webhooks), on the wire: a real uvicorn
server, requests made with httpx and signed with the `standardwebhooks` library. Also the keys'
configuration, the credential in the printed catalog, and the shared signature vectors."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import sluice
from sluice.tool import (
    ENV_VAR,
    Call,
    SigningKeyError,
    ToolApp,
    new_signing_key,
    signature_header,
)
from sluice.tool.signing import Rejected, Verifier, parse_keys

import toolbox
from servers import AppServer, SluiceDev
from signed import KEY, sign, signature
from toolbox import World

OLD, NEW, STRANGER = new_signing_key(), new_signing_key(), new_signing_key()
VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "test-vectors" / "standard-webhooks.json").read_text()
)


def payments(calls: Counter[str], **config: Any) -> ToolApp:
    """A payout tool counting each function's runs (dispatch, status, compensate)."""
    app = ToolApp(**config)

    def find(business_key: str) -> dict[str, Any] | None:
        calls["status"] += 1
        return None

    def undo(external_ref: str, call: Call) -> dict[str, Any]:
        calls["undo"] += 1
        return {"id": f"rev-{external_ref}"}

    @app.tool(
        "pay/out",
        semantics=sluice.NON_IDEMPOTENT,
        business_key="{to}:{amount}",
        status=find,
        compensate=undo,
    )
    def payout(to: str, amount: int) -> dict[str, Any]:
        calls["payout"] += 1
        return {"id": f"p-{calls['payout']}", "to": to, "amount": amount}

    return app


@pytest.fixture(scope="module")
def calls() -> Counter[str]:
    return Counter()


@pytest.fixture(scope="module")
def url(calls: Counter[str]) -> Iterator[str]:
    """The payout tool holding two keys, as during a rotation."""
    with AppServer(payments(calls, signing_keys=[OLD, NEW])) as server:
        yield server.url


def body(n: int) -> bytes:
    return json.dumps({"to": f"acc-{n}", "amount": n}).encode()


def send(
    url: str, path: str, content: bytes = b"", headers: dict[str, str] | None = None
) -> httpx.Response:
    method = "GET" if "/by-key/" in path else "POST"
    call = {"idempotency-key": f"r-1/{uuid.uuid4()}", "content-type": "application/json"}
    return httpx.request(method, url + path, content=content, headers={**call, **(headers or {})})


def refused(answer: httpx.Response, reason: str) -> None:
    """A 401 whose JSON error says `reason`, and holds no key."""
    assert answer.status_code == 401, answer.text
    assert reason in answer.json()["error"], answer.json()
    for key in (OLD, NEW, STRANGER):
        assert key.removeprefix("whsec_") not in answer.text


def test_an_unsigned_call_is_refused_on_every_route_and_nothing_runs(
    url: str, calls: Counter[str]
) -> None:
    before = dict(calls)
    routes = ["/pay/out", "/pay/out/by-key/acc-1%3A1", "/pay/out/compensate/p-1", "/no/such"]
    for path in routes:
        refused(
            send(url, path, body(1)),
            "unsigned request: missing webhook-id, webhook-timestamp, webhook-signature",
        )
    unsigned = {k: v for k, v in sign(body(1)).items() if k != "webhook-signature"}
    refused(send(url, "/pay/out", body(1), unsigned), "missing webhook-signature")
    assert dict(calls) == before


def test_a_call_signed_with_another_key_is_refused(url: str, calls: Counter[str]) -> None:
    before = dict(calls)
    for path in ("/pay/out", "/pay/out/by-key/acc-2%3A2", "/pay/out/compensate/p-1"):
        content = b"" if "/by-key/" in path else body(2)
        answer = send(url, path, content, sign(content, [STRANGER]))
        refused(answer, "no v1 signature matches this service's signing keys")
    assert dict(calls) == before


@pytest.mark.parametrize(("offset", "when"), [(-360, "in the past"), (360, "in the future")])
def test_a_timestamp_six_minutes_off_is_refused(
    url: str, calls: Counter[str], offset: int, when: str
) -> None:
    before = dict(calls)
    headers = sign(body(3), [NEW], timestamp=int(time.time()) + offset)
    refused(send(url, "/pay/out", body(3), headers), f"s {when}")
    assert dict(calls) == before


def test_a_replayed_webhook_id_is_refused(url: str, calls: Counter[str]) -> None:
    before = calls["payout"]
    headers = sign(body(4), [NEW])
    assert send(url, "/pay/out", body(4), headers).status_code == 201
    # The same request again, byte for byte: the idempotency store would answer it, but the
    # replay cache refuses it first. Another path with the same signed id and body too.
    refused(send(url, "/pay/out", body(4), headers), "was already accepted")
    refused(send(url, "/pay/out/compensate/p-1", body(4), headers), "was already accepted")
    assert calls["payout"] == before + 1


def test_a_body_altered_after_signing_is_refused(url: str, calls: Counter[str]) -> None:
    before = dict(calls)
    headers = sign(body(5), [NEW])
    altered = body(5).replace(b'"amount": 5', b'"amount": 500')
    assert altered != body(5)
    refused(send(url, "/pay/out", altered, headers), "no v1 signature matches")
    # So is the id or the timestamp: both are signed.
    moved = {**headers, "webhook-id": headers["webhook-id"] + "x"}
    refused(send(url, "/pay/out", body(5), moved), "no v1 signature matches")
    later = {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}
    refused(send(url, "/pay/out", body(5), later), "no v1 signature matches")
    assert dict(calls) == before


def test_either_key_of_a_rotation_is_accepted(url: str, calls: Counter[str]) -> None:
    before = calls["payout"]
    assert send(url, "/pay/out", body(6), sign(body(6), [NEW])).status_code == 201
    assert send(url, "/pay/out", body(7), sign(body(7), [OLD])).status_code == 201
    status = send(url, "/pay/out/by-key/acc-6%3A6", b"", sign(b"", [NEW]))
    assert status.status_code == 404  # the status function ran (and found nothing)
    assert calls["payout"] == before + 2


def test_one_valid_entry_among_several_is_accepted(url: str, calls: Counter[str]) -> None:
    before = calls["payout"]
    headers = sign(body(8), [STRANGER, NEW])  # what Sluice sends holding a key we do not
    first, valid = headers["webhook-signature"].split(" ")
    headers["webhook-signature"] = f"v2,{valid[3:]} {first} v1a,zz garbage  {valid}"
    assert send(url, "/pay/out", body(8), headers).status_code == 201
    headers = sign(body(9), [NEW])
    headers["webhook-signature"] = "v2," + headers["webhook-signature"][3:] + " nonsense"
    refused(send(url, "/pay/out", body(9), headers), "holds no v1,<base64 HMAC-SHA256> entry")
    assert calls["payout"] == before + 1


def test_a_non_numeric_timestamp_is_refused(url: str) -> None:
    headers = {**sign(body(10), [NEW]), "webhook-timestamp": "1e9"}
    refused(send(url, "/pay/out", body(10), headers), "must be whole unix seconds")


def test_the_replay_cache_is_bounded() -> None:
    verifier = Verifier(parse_keys([NEW], "test"), max_remembered=2)
    signed = [sign(b"{}", [NEW], message_id=f"id-{n}") for n in range(3)]
    for headers in signed:
        verifier.verify(headers, b"{}")
    with pytest.raises(Rejected, match="already accepted"):
        verifier.verify(signed[2], b"{}")
    # The oldest was forgotten to make room: within the window it would pass again. This is the
    # price of the bound; only a holder of a key can fill the cache (ids are remembered after
    # their signature verified).
    verifier.verify(signed[0], b"{}")


# --- configuration -------------------------------------------------------------------------


def test_without_a_key_the_app_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(SigningKeyError) as unset:
        ToolApp()
    message = str(unset.value)
    assert "SLUICE_TOOL_SIGNING_KEYS is not set" in message
    assert "Set SLUICE_TOOL_SIGNING_KEYS" in message and "allow_unsigned=True" in message
    monkeypatch.setenv(ENV_VAR, "  \n ")
    with pytest.raises(SigningKeyError, match="SLUICE_TOOL_SIGNING_KEYS is not set"):
        ToolApp()
    with pytest.raises(SigningKeyError, match=r"signing_keys is empty.*allow_unsigned=True"):
        ToolApp(signing_keys=[])


def test_keys_come_from_the_variable_when_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, f"{OLD}\n  {NEW} ")
    calls: Counter[str] = Counter()
    with AppServer(payments(calls)) as server:
        accepted = send(server.url, "/pay/out", body(1), sign(body(1), [NEW]))
        refused(send(server.url, "/pay/out", body(2)), "unsigned request")
        refused(send(server.url, "/pay/out", body(3), sign(body(3), [STRANGER])), "no v1")
    assert accepted.status_code == 201 and calls["payout"] == 1
    # Keys passed win over the variable.
    app = payments(Counter(), signing_keys=f"{STRANGER}")
    with AppServer(app) as server:
        refused(send(server.url, "/pay/out", body(4), sign(body(4), [NEW])), "no v1")


def test_allow_unsigned_serves_anyone_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    calls: Counter[str] = Counter()
    with caplog.at_level(logging.WARNING, logger="sluice.tool"):
        app = payments(calls, allow_unsigned=True)
    assert "anyone who can reach this service can call its tools" in caplog.text
    assert not app.verifies_signatures
    with AppServer(app) as server:
        assert send(server.url, "/pay/out", body(1)).status_code == 201
    assert calls["payout"] == 1
    # A key given wins: the opt-out only covers having none.
    assert payments(Counter(), signing_keys=[NEW], allow_unsigned=True).verifies_signatures


@pytest.mark.parametrize("invalid", VECTORS["invalid_keys"], ids=lambda v: v["why"])
def test_a_malformed_key_is_refused_without_being_shown(
    invalid: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SigningKeyError) as passed:
        ToolApp(signing_keys=[NEW, invalid["key"]])
    assert "signing key 2 of 2 (from signing_keys)" in str(passed.value)
    monkeypatch.setenv(ENV_VAR, invalid["key"])
    with pytest.raises(SigningKeyError) as from_env:
        ToolApp()
    assert f"signing key 1 of 1 (from the {ENV_VAR} environment variable)" in str(from_env.value)
    for error in (passed.value, from_env.value):
        secret = invalid["key"].removeprefix("whsec_")
        assert not secret or secret not in str(error)
        assert NEW.removeprefix("whsec_") not in str(error)


def test_each_malformation_is_named() -> None:
    key = "whsec_" + base64.b64encode(bytes(range(16))).decode()
    cases = {
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw": "does not start with whsec_",
        "whsec_MfKQ9r8GKYqr*wjUPD8ILPZIo2LaLaSw": "is not valid base64",
        key: "decodes to 16 bytes; a key needs at least 24",
    }
    for given, named in cases.items():
        with pytest.raises(SigningKeyError, match=named):
            parse_keys([given], "test")


# --- the shared vectors --------------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["signatures"], ids=lambda v: v["name"][:40])
def test_the_shared_signature_vectors(case: dict[str, Any]) -> None:
    content = case["body"].encode()
    expected = case["webhook_signature"]
    # The library, as the tests sign; and the SDK's signer, as a tool author's tests would.
    assert signature(content, case["keys"], case["webhook_id"], case["webhook_timestamp"]) == (
        expected
    )
    assert signature_header(
        case["keys"], case["webhook_id"], case["webhook_timestamp"], content
    ) == (expected)
    assert len(parse_keys(case["keys"], "vectors")) == len(expected.split(" "))


# --- the catalog ---------------------------------------------------------------------------


def test_the_catalog_names_the_credential_and_never_a_key() -> None:
    app = payments(Counter(), signing_keys=[OLD, NEW])
    printed = app.catalog_toml("http://tools:9000")
    assert printed.startswith(
        "[credentials.tool_services]\n"
        'kind = "standard_webhooks"\n'
        'keys = [{ env = "SLUICE_TOOL_SIGNING_KEYS" }]\n'
        "\n[[tool]]\n"
        'name = "pay/out"\n'
        'credential = "tool_services"\n'
    )
    assert printed.count("[credentials.") == 1
    assert (
        "[tool.status_check]\n"
        'url = "http://tools:9000/pay/out/by-key/{business_key}"\n'
        "absent_status = [404]\n"
        "duplicate_status = [409]\n"
    ) in printed
    for key in (OLD, NEW):
        assert key.removeprefix("whsec_") not in printed
    catalog = tomllib.loads(printed)
    assert catalog["tool"][0]["credential"] == "tool_services"

    named = tomllib.loads(app.catalog_toml("http://t", credential="pay", keys_env="PAY_KEYS"))
    assert named["credentials"] == {
        "pay": {"kind": "standard_webhooks", "keys": [{"env": "PAY_KEYS"}]}
    }
    assert named["tool"][0]["credential"] == "pay"
    filed = tomllib.loads(app.catalog_toml("http://t", keys_file="/etc/sluice/tool-keys"))
    assert filed["credentials"]["tool_services"]["keys"] == [{"file": "/etc/sluice/tool-keys"}]
    with pytest.raises(ValueError, match="not both"):
        app.catalog_toml("http://t", keys_env="A", keys_file="/b")
    for invalid in ("tool services", "Tool_services", "tool-services"):
        with pytest.raises(ValueError, match="Sluice takes snake_case"):
            app.catalog_toml("http://t", credential=invalid)
    with pytest.raises(ValueError, match="not an environment variable"):
        app.catalog_toml("http://t", keys_env="MY-KEYS")


def test_an_unsigned_app_prints_no_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    app = payments(Counter(), allow_unsigned=True)
    catalog = tomllib.loads(app.catalog_toml("http://t"))
    assert "credentials" not in catalog and "credential" not in catalog["tool"][0]
    asked = tomllib.loads(app.catalog_toml("http://t", credential="later"))
    assert asked["tool"][0]["credential"] == "later" and "later" in asked["credentials"]


def test_the_command_line_takes_the_credential_options() -> None:
    printed = subprocess.run(
        [
            *(sys.executable, "-m", "sluice.tool", "toolbox:app", "http://127.0.0.1:9"),
            *("--credential", "shop", "--keys-file", "/run/secrets/tool-keys"),
        ],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == toolbox.app.catalog_toml(
        "http://127.0.0.1:9", credential="shop", keys_file="/run/secrets/tool-keys"
    )
    assert tomllib.loads(printed.stdout)["credentials"]["shop"]["keys"] == [
        {"file": "/run/secrets/tool-keys"}
    ]


def test_the_command_line_explains_a_missing_key(tmp_path: Path) -> None:
    (tmp_path / "keyless.py").write_text("from sluice.tool import ToolApp\napp = ToolApp()\n")
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    printed = subprocess.run(
        [sys.executable, "-m", "sluice.tool", "keyless:app", "http://127.0.0.1:9"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 2
    assert "keyless:app could not be built: ToolApp has no signing key" in printed.stderr


# --- with Sluice: `sluice dev` signs every call with the keys in SLUICE_TOOL_SIGNING_KEYS ------


@pytest.fixture(scope="module")
def catalog(tools_server: AppServer) -> str:
    return toolbox.catalog(tools_server.url)


def test_sluice_holding_another_key_runs_nothing(
    catalog: str, tmp_path: Path, run_id: str, world: World
) -> None:
    before = world.calls["shop/notify"]
    with (
        SluiceDev(tmp_path, catalog, signing_keys=[STRANGER]) as dev,
        sluice.Client(dev.url, dev.agent_token, wait=30) as client,
        client.run(run_id) as run,
        pytest.raises(sluice.EffectError) as refused_call,
    ):
        run.call("shop/notify", {"to": "a@example.com", "text": "never sent"}, wait=10)
    assert refused_call.value.status != "CONFIRMED"
    assert world.calls["shop/notify"] == before


def test_sluice_mid_rotation_signs_with_both_keys(
    catalog: str, tmp_path: Path, run_id: str, world: World
) -> None:
    # Sluice holds the key the tool no longer has and the one it has: one entry matches.
    before = world.calls["shop/notify"]
    with (
        SluiceDev(tmp_path, catalog, signing_keys=[STRANGER, KEY]) as dev,
        sluice.Client(dev.url, dev.agent_token, wait=30) as client,
        client.run(run_id) as run,
    ):
        sent = run.call("shop/notify", {"to": "a@example.com", "text": "rotated"})
    assert sent.status == "CONFIRMED" and sent.result["text"] == "rotated"
    assert world.calls["shop/notify"] == before + 1

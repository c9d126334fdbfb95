"""The journal and keys against the shared vectors every Sluice client checks itself against
(sdk/test-vectors/journal.json, read from the repository)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice import CommandKey, InvalidId, Journal, check_run_id, check_tool_name, resolve_tool

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "test-vectors" / "journal.json").read_text()
)


@pytest.mark.parametrize("vector", VECTORS["keys"], ids=lambda v: v["command_key"])
def test_keys(vector: dict[str, Any]) -> None:
    key = CommandKey(vector["decision"], vector["tool"], vector["call_idx"])
    assert str(key) == vector["command_key"]
    assert key.idempotency_key(vector["run_id"]) == vector["idempotency_key"]
    assert key.path_segment == vector["command_key_path_segment"]
    assert CommandKey.parse(vector["command_key"]) == key


@pytest.mark.parametrize("journal", VECTORS["journals"], ids=lambda j: j["name"])
def test_journals(journal: dict[str, Any]) -> None:
    walked = Journal()
    keys = []
    for step in journal["steps"]:
        if step == "decide":
            walked.decide()
        else:
            verb, tool = step.split(" ")
            assert verb == "call"
            keys.append(str(walked.next_call(tool)))
    assert keys == journal["keys"]


@pytest.mark.parametrize("run_id", VECTORS["invalid"]["run_ids"])
def test_invalid_run_ids(run_id: str) -> None:
    with pytest.raises(InvalidId):
        check_run_id(run_id)


@pytest.mark.parametrize("name", VECTORS["invalid"]["tool_names"])
def test_invalid_tool_names(name: str) -> None:
    with pytest.raises(InvalidId):
        check_tool_name(name)


@pytest.mark.parametrize("raw", VECTORS["invalid"]["command_keys"])
def test_invalid_command_keys(raw: str) -> None:
    with pytest.raises(InvalidId):
        CommandKey.parse(raw)


def test_bare_names_resolve_in_the_default_namespace() -> None:
    assert resolve_tool("send", "default") == "default/send"
    assert resolve_tool("email/send", "default") == "email/send"
    journal = Journal()
    assert str(journal.next_call(resolve_tool("send", "email"))) == "d-1/email/send/0"
    assert str(journal.next_call(resolve_tool("email/send", "x"))) == "d-1/email/send/1"

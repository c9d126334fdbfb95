"""`sluice mcp` driven by the official MCP TypeScript SDK (npm `@modelcontextprotocol/sdk`,
pinned in tests/mcp/ts/package.json; scripts/suites/mcp.sh installs it with `npm ci`) over
streamable HTTP and stdio, against a real `sluice dev`. The SDK speaks the handshake versions
(its newest is 2025-11-25), so over HTTP each client is a session: its conversation, and a new
session naming the run re-drives it with the same keys and the stored results."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import uuid
from typing import Any

from conftest import AGENT_TOKEN, SLUICE, Sluice
from test_mcp import EMAIL, effects_of, http_server

CLIENT = pathlib.Path(__file__).resolve().parent / "ts" / "client.mjs"



def ts_client(config: dict[str, Any]) -> dict[str, Any]:
    assert shutil.which("node"), "node (20 or later) is needed"
    assert (CLIENT.parent / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(), (
        "the SDK is not installed: scripts/suites/mcp.sh runs npm ci in tests/mcp/ts")
    done = subprocess.run(["node", str(CLIENT), json.dumps(config)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_typescript_sdk_over_http_gets_a_session_and_re_drives(sluice: Sluice) -> None:
    run_id = f"r-mcp-ts-{uuid.uuid4().hex[:8]}"
    calls = [{"name": "email__send", "arguments": EMAIL, "meta": {"dev.sluice/run_id": run_id}},
             {"name": "email__send", "arguments": {**EMAIL, "subject": "second"},
              "meta": {"dev.sluice/run_id": run_id}}]
    with http_server(sluice) as url:
        first = ts_client({"transport": "http", "url": url, "token": AGENT_TOKEN, "calls": calls})
        again = ts_client({"transport": "http", "url": url, "token": AGENT_TOKEN,
                           "calls": calls[:1]})
    assert first["protocolVersion"] == "2025-11-25", first
    assert first["sessionId"] and again["sessionId"] != first["sessionId"], (first, again)
    assert "email__send" in first["tools"]
    said = [r["structured"] for r in first["results"]]
    assert [(s["status"], s["command_key"]) for s in said] == [
        ("CONFIRMED", "d-1/email/send/0"), ("CONFIRMED", "d-1/email/send/1")], said
    redriven = again["results"][0]["structured"]
    assert redriven["command_key"] == "d-1/email/send/0"
    assert redriven["external_ref"] == said[0]["external_ref"], "the stored result"
    assert len(effects_of(sluice, run_id)) == 2


def test_the_typescript_sdk_over_stdio(sluice: Sluice) -> None:
    run_id = f"r-mcp-ts-{uuid.uuid4().hex[:8]}"
    seen = ts_client({
        "transport": "stdio", "command": SLUICE,
        "args": ["mcp", "--url", sluice.url, "--run-id", run_id, "--max-wait-s", "20"],
        "env": {"SLUICE_TOKEN": AGENT_TOKEN, "RUST_LOG": "warn"},
        "calls": [{"name": "email__send", "arguments": EMAIL}],
    })
    result = seen["results"][0]
    assert not result["isError"], result
    assert (result["structured"]["status"], result["structured"]["run_id"]) == ("CONFIRMED", run_id)
    assert [e["submitted_by"] for e in effects_of(sluice, run_id)] == ["mcp-agent"]

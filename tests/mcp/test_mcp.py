"""`sluice mcp` driven by the official MCP client SDK (PyPI `mcp`) over both transports,
against a real `sluice dev`: the catalog is listed with its schemas, each tool call is an
effect recorded and run by Sluice, a re-driven session gets the same keys and the stored
results, and effects that wait for a person come back as results that say so."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_AGENT_TOKEN,
    SLOW_CALLS,
    SLUICE,
    Sluice,
    api,
    first_line,
)

pytestmark = pytest.mark.anyio

EMAIL = {"to": "ops@example.com", "subject": "hello", "body": "from an MCP agent"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def stdio_session(sluice: Sluice, run_id: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=SLUICE,
        args=["mcp", "--url", sluice.url, "--run-id", run_id, "--max-wait-s", "20"],
        env={"SLUICE_TOKEN": AGENT_TOKEN, "RUST_LOG": "warn"},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@contextlib.contextmanager
def http_server(sluice: Sluice, own_token: str | None = None) -> Any:
    """`sluice mcp --transport http`, with no token of its own unless `own_token` is given
    (`SLUICE_TOKEN`, which only stdio may use): callers bring theirs."""
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "warn"}
    if own_token is not None:
        env["SLUICE_TOKEN"] = own_token
    process = subprocess.Popen(
        [SLUICE, "mcp", "--transport", "http", "--listen", "127.0.0.1:0", "--url", sluice.url,
         "--max-wait-s", "20"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield first_line(process, "listening on").rsplit(" ", 1)[-1]
    finally:
        process.terminate()
        process.wait(timeout=20)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    client = create_mcp_http_client(headers=headers)
    async with client, streamable_http_client(url, http_client=client) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def facts(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None or result.structuredContent is not None
    structured = getattr(result, "structured_content", None) or result.structuredContent
    text = json.loads(result.content[0].text)
    assert text == structured, "the text and the structured content say the same"
    return structured


def is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


def effects_of(sluice: Sluice, run_id: str) -> list[dict[str, Any]]:
    return api(sluice, "GET", f"/v1/runs/{run_id}/effects", ADMIN_TOKEN)["effects"]


async def test_the_catalog_is_listed_with_schemas_and_semantics(sluice: Sluice) -> None:
    async with stdio_session(sluice, f"r-mcp-{uuid.uuid4().hex[:8]}") as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert {"payments__wire", "email__send", "tickets__create", "lab__stall"} <= set(listed)
    wire = listed["payments__wire"]
    assert wire.input_schema["required"] == ["account", "amount_minor", "beneficiary", "date"]
    assert "NON_IDEMPOTENT" in wire.description and "approval" in wire.description
    assert wire.annotations.idempotent_hint is False
    assert listed["search__lookup"].annotations.read_only_hint is True


async def test_a_call_runs_once_and_a_re_driven_session_gets_the_stored_result(sluice: Sluice) -> None:
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    async with stdio_session(sluice, run_id) as session:
        first = await session.call_tool("email__send", EMAIL)
        second = await session.call_tool("email__send", {**EMAIL, "subject": "second"})
    assert not is_error(first), first
    done = facts(first)
    assert (done["status"], done["command_key"], done["run_id"]) == (
        "CONFIRMED", "d-1/email/send/0", run_id)
    assert done["external_ref"], done
    assert facts(second)["command_key"] == "d-1/email/send/1"

    # The agent is re-driven from the start: same positions, same keys, the stored results.
    async with stdio_session(sluice, run_id) as session:
        again = await session.call_tool("email__send", EMAIL)
    assert facts(again)["external_ref"] == done["external_ref"]
    assert facts(again)["command_key"] == "d-1/email/send/0"
    effects = effects_of(sluice, run_id)
    assert len(effects) == 2, "the re-drive made no new effect"
    assert {e["submitted_by"] for e in effects} == {"mcp-agent"}


async def test_drift_and_bad_arguments_are_errors_the_model_can_read(sluice: Sluice) -> None:
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    async with stdio_session(sluice, run_id) as session:
        await session.call_tool("email__send", EMAIL)
    async with stdio_session(sluice, run_id) as session:
        drifted = await session.call_tool("email__send", {**EMAIL, "body": "something else"})
        bad = await session.call_tool("email__send", {"to": "not an address"})
    assert is_error(drifted)
    assert facts(drifted)["code"] == "argument_drift"
    assert "same order" in facts(drifted)["message"]
    assert is_error(bad)
    assert facts(bad)["http_status"] == 422
    assert len(effects_of(sluice, run_id)) == 1, "nothing refused was recorded"


async def test_effects_waiting_for_a_person_say_so_with_their_key(sluice: Sluice) -> None:
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    big_wire = {"account": "acc-1", "amount_minor": 5_000_000, "beneficiary": "b-1",
                "date": "2026-11-25"}
    async with stdio_session(sluice, run_id) as session:
        blocked = await session.call_tool("payments__wire", big_wire)
        stuck = await session.call_tool("lab__stall", {"slot": f"s-{run_id}"})
    for result, status, key in [(blocked, "BLOCKED", "d-1/payments/wire/0"),
                                (stuck, "STUCK", "d-1/lab/stall/0")]:
        assert not is_error(result), "a person's wait is not the model's error"
        said = facts(result)
        assert (said["status"], said["command_key"]) == (status, key), said
        assert "person" in said["message"] and key in said["message"]
    statuses = {e["command_key"]: e["status"] for e in effects_of(sluice, run_id)}
    assert statuses == {"d-1/payments/wire/0": "BLOCKED", "d-1/lab/stall/0": "STUCK"}


async def test_over_http_each_session_is_a_run_and_callers_act_as_themselves(sluice: Sluice) -> None:
    with http_server(sluice) as url:
        async with http_session(url, AGENT_TOKEN) as session:
            tools = await session.list_tools()
            assert "email__send" in {t.name for t in tools.tools}
            done = facts(await session.call_tool("email__send", EMAIL))
            again = facts(await session.call_tool("email__send", EMAIL))
        assert done["status"] == "CONFIRMED"
        assert done["run_id"].startswith("mcp-")
        assert again["command_key"] == "d-1/email/send/1", "call order is the journal"
        effects = effects_of(sluice, done["run_id"])
        assert {e["submitted_by"] for e in effects} == {"mcp-agent"}

        # Another agent's session is another run, under its own name.
        async with http_session(url, OTHER_AGENT_TOKEN) as session:
            other = facts(await session.call_tool("email__send", EMAIL))
        assert other["run_id"] != done["run_id"]
        assert effects_of(sluice, other["run_id"])[0]["submitted_by"] == "other-agent"

        # A client naming its run in _meta walks that run's journal.
        named = f"r-mcp-{uuid.uuid4().hex[:8]}"
        async with http_session(url, AGENT_TOKEN) as session:
            result = await session.call_tool(
                "email__send", EMAIL, meta={"dev.sluice/run_id": named, "dev.sluice/decision": 3})
        assert (facts(result)["run_id"], facts(result)["command_key"]) == (named, "d-3/email/send/0")

        # A token Sluice does not know: refused at initialize, and nothing is recorded.
        with pytest.raises(Exception) as refused:
            async with http_session(url, "not-a-known-token-at-all") as session:
                await session.call_tool("email__send", EMAIL)
        assert "not recognised" in repr(refused.value), repr(refused.value)


async def test_the_http_transport_refuses_browser_origins(sluice: Sluice) -> None:
    with http_server(sluice) as url:
        answer = httpx.post(
            url,
            headers={"origin": "https://evil.example", "content-type": "application/json",
                     "accept": "application/json, text/event-stream",
                     "authorization": f"Bearer {AGENT_TOKEN}"},
            content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "page", "version": "1"}}}),
        )
    assert answer.status_code == 403, answer.text


async def test_an_unknown_tool_is_a_protocol_error(sluice: Sluice) -> None:
    async with stdio_session(sluice, f"r-mcp-{uuid.uuid4().hex[:8]}") as session:
        with pytest.raises(Exception, match="namespace__name"):
            await session.call_tool("no_such_tool", {})


@contextlib.asynccontextmanager
async def session_over(transport: str, sluice: Sluice, run_id: str) -> AsyncIterator[ClientSession]:
    """A session of `run_id` over `transport` (over HTTP the run is named in each call's
    `_meta`, see `call`)."""
    if transport == "stdio":
        async with stdio_session(sluice, run_id) as session:
            yield session
    else:
        with http_server(sluice) as url:
            async with http_session(url, AGENT_TOKEN) as session:
                yield session


async def call(session: ClientSession, run_id: str, tool: str, args: dict[str, Any],
               **more: Any) -> Any:
    meta = {"dev.sluice/run_id": run_id, **more.pop("meta", {})}
    return await session.call_tool(tool, args, meta=meta, **more)


async def test_http_sessions_naming_one_run_re_drive_it(sluice: Sluice) -> None:
    """Each new session of a run walks its journal from the start: a re-drive over HTTP gets
    the same keys and the stored results, as it does over stdio."""
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    ticket = {"title": f"printer on fire ({run_id})"}
    answers = []
    with http_server(sluice) as url:
        for _ in range(3):
            async with http_session(url, AGENT_TOKEN) as session:
                answers.append(facts(await call(session, run_id, "tickets__create", ticket)))
    assert [a["command_key"] for a in answers] == ["d-1/tickets/create/0"] * 3, answers
    assert len({a["external_ref"] for a in answers}) == 1, "one ticket, told three times"
    assert len(effects_of(sluice, run_id)) == 1


async def test_two_sessions_sharing_a_run_share_its_positions(sluice: Sluice) -> None:
    """Sessions that name one run at once (an agent started twice by mistake) walk the same
    positions: other arguments at a position are refused as drift; the same arguments are one
    effect. (Another agent's token cannot enter the run at all: the API's run ownership.)"""
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    with http_server(sluice) as url:
        async with http_session(url, AGENT_TOKEN) as first, \
                http_session(url, AGENT_TOKEN) as second, \
                http_session(url, AGENT_TOKEN) as third:
            mine = await call(first, run_id, "tickets__create", {"title": "mine"})
            theirs = await call(second, run_id, "tickets__create", {"title": "theirs"})
            same = await call(third, run_id, "tickets__create", {"title": "mine"})
    assert facts(mine)["command_key"] == "d-1/tickets/create/0"
    assert is_error(theirs) and facts(theirs)["code"] == "argument_drift", facts(theirs)
    assert facts(same)["command_key"] == "d-1/tickets/create/0"
    assert facts(same)["external_ref"] == facts(mine)["external_ref"]
    assert len(effects_of(sluice, run_id)) == 1


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_retry_after_the_client_gave_up_takes_the_same_position(
        sluice: Sluice, transport: str) -> None:
    """A client whose own timeout fires cancels the request; the same call again is its
    retry, at the same position: the upstream is called once. A call that was answered is
    spent: the next one, even with the same arguments, is a new effect."""
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    room = f"room-{transport}-{uuid.uuid4().hex[:6]}"
    async with session_over(transport, sluice, run_id) as session:
        with pytest.raises(Exception):
            await call(session, run_id, "lab__slow", {"room": room}, read_timeout_seconds=0.3)
        retried = await call(session, run_id, "lab__slow", {"room": room})
        again = await call(session, run_id, "lab__slow", {"room": room})
    assert not is_error(retried), retried
    assert (facts(retried)["status"], facts(retried)["command_key"]) == (
        "CONFIRMED", "d-1/lab/slow/0")
    assert facts(again)["command_key"] == "d-1/lab/slow/1"
    assert SLOW_CALLS[room] == 2, "the retry did not reach the upstream again"
    assert len(effects_of(sluice, run_id)) == 2


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_call_that_names_its_position_keeps_it(sluice: Sluice, transport: str) -> None:
    """`dev.sluice/call` names the call index: a client that retries names the same one, in
    this session or a later one, and gets the stored result."""
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    at = {"dev.sluice/call": 4}
    async with session_over(transport, sluice, run_id) as session:
        first = await call(session, run_id, "email__send", EMAIL, meta=at)
        retried = await call(session, run_id, "email__send", EMAIL, meta=at)
        next_one = await call(session, run_id, "email__send", EMAIL)
    assert facts(first)["command_key"] == "d-1/email/send/4"
    assert facts(retried)["command_key"] == "d-1/email/send/4"
    assert facts(retried)["external_ref"] == facts(first)["external_ref"]
    assert facts(next_one)["command_key"] == "d-1/email/send/5", "the journal moved past it"
    assert len(effects_of(sluice, run_id)) == 2


async def test_over_http_the_process_token_is_never_lent(sluice: Sluice) -> None:
    """`SLUICE_TOKEN` is the stdio client's: over HTTP a caller without a bearer token of its
    own is refused before MCP, and one with a token acts as itself, not as the process."""
    with http_server(sluice, own_token=ADMIN_TOKEN) as url:
        answer = httpx.post(
            url,
            headers={"content-type": "application/json",
                     "accept": "application/json, text/event-stream"},
            content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "local process", "version": "1"}}}),
        )
        assert answer.status_code == 401, answer.text
        assert answer.headers.get("www-authenticate", "").lower().startswith("bearer")
        assert "token" in answer.text

        run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
        with pytest.raises(Exception):
            async with http_session(url, None) as session:
                await call(session, run_id, "email__send", EMAIL)

        async with http_session(url, AGENT_TOKEN) as session:
            mine = facts(await call(session, run_id, "email__send", EMAIL))
    # The refused session recorded nothing; the agent's call is its own.
    assert [e["submitted_by"] for e in effects_of(sluice, run_id)] == ["mcp-agent"], mine


@contextlib.asynccontextmanager
async def sdk_client(url: str, token: str, mode: str | None = None) -> AsyncIterator[Any]:
    """The SDK's high-level `mcp.Client`, which negotiates the protocol version itself (or is
    pinned to `mode`)."""
    from mcp import Client

    http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
    transport = streamable_http_client(url, http_client=http)
    async with http, (Client(transport) if mode is None else Client(transport, mode=mode)) as client:
        yield client


async def test_the_sdk_s_handshake_client_gets_a_session_and_re_drives(sluice: Sluice) -> None:
    """`mcp.Client` pinned to the handshake (`mode="legacy"`, what a handshake-era client
    does): each client is a session, its conversation, and a re-drive keeps its keys. (The
    SDK's default negotiates MCP 2026-07-28 instead: test_modern.py.)"""
    run_id = f"r-mcp-{uuid.uuid4().hex[:8]}"
    ticket = {"title": f"re-driven by the SDK ({run_id})"}
    keys = []
    with http_server(sluice) as url:
        for _ in range(2):
            async with sdk_client(url, AGENT_TOKEN, mode="legacy") as client:
                assert client.protocol_version == "2025-11-25", client.protocol_version
                first = await client.call_tool(
                    "tickets__create", ticket, meta={"dev.sluice/run_id": run_id})
                second = await client.call_tool(
                    "tickets__create", ticket, meta={"dev.sluice/run_id": run_id})
                keys.append((facts(first)["command_key"], facts(second)["command_key"]))
    assert keys == [("d-1/tickets/create/0", "d-1/tickets/create/1")] * 2, keys
    assert len(effects_of(sluice, run_id)) == 2


async def _stdio_stderr(sluice: Sluice, tmp_path: Any, name: str, args: list[str],
                        env: dict[str, str]) -> str:
    """Runs one stdio session (initialize, one call) and returns what the server wrote on
    stderr."""
    log = tmp_path / f"{name}.stderr"
    params = StdioServerParameters(
        command=SLUICE,
        args=["mcp", "--url", sluice.url, "--max-wait-s", "20", *args],
        env={"SLUICE_TOKEN": AGENT_TOKEN, **env},
    )
    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("email__send", EMAIL)
    return log.read_text()


async def test_stdio_is_quiet_on_stderr_unless_asked(sluice: Sluice, tmp_path: Any) -> None:
    """An MCP client shows a stdio server's stderr to its user: by default it holds warnings
    and errors only; `--log-level` (or RUST_LOG) asks for more."""
    quiet = await _stdio_stderr(sluice, tmp_path, "quiet", [], {})
    assert "INFO" not in quiet, quiet
    flagged = await _stdio_stderr(sluice, tmp_path, "flag", ["--log-level", "info"], {})
    assert "mcp tool call" in flagged, flagged
    from_env = await _stdio_stderr(sluice, tmp_path, "env", [], {"RUST_LOG": "info"})
    assert "mcp tool call" in from_env, from_env


async def test_a_session_delete_is_answered_as_the_sdk_expects(
        sluice: Sluice, caplog: pytest.LogCaptureFixture) -> None:
    """The transport specification has a client end its session with DELETE; the session is
    gone when the answer comes, so it is 204 (the SDK takes 200 or 204 and logs "Session
    termination failed" on anything else), and the session is then unknown (404)."""
    with http_server(sluice) as url:
        with caplog.at_level("DEBUG"):
            async with http_session(url, AGENT_TOKEN) as session:
                await session.list_tools()
        assert "Session termination failed" not in caplog.text, caplog.text

        headers = {"content-type": "application/json",
                   "accept": "application/json, text/event-stream",
                   "authorization": f"Bearer {AGENT_TOKEN}"}
        init = httpx.post(url, headers=headers, content=json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}))
        assert init.status_code == 200, init.text
        session_headers = {**headers, "mcp-session-id": init.headers["mcp-session-id"],
                           "mcp-protocol-version": "2025-11-25"}
        gone = httpx.delete(url, headers=session_headers)
        assert gone.status_code == 204, (gone.status_code, gone.text)
        after = httpx.post(url, headers=session_headers, content=json.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        assert after.status_code == 404, after.text


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_token_sluice_does_not_know_is_refused_at_initialize(
        sluice: Sluice, transport: str) -> None:
    """A wrong token is found at `initialize`, with a message the client shows, not at the
    first `tools/list` as an internal error."""
    bad = "not-a-known-token-at-all"
    with pytest.raises(Exception) as refused:
        if transport == "stdio":
            params = StdioServerParameters(
                command=SLUICE, args=["mcp", "--url", sluice.url],
                env={"SLUICE_TOKEN": bad})
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
        else:
            with http_server(sluice) as url:
                async with http_session(url, bad):
                    pass
    # The client's task groups wrap the MCPError that carries Sluice's message.
    said = repr(refused.value)
    assert "MCPError(-32001" in said and "not recognised" in said, said
    assert bad not in said, "the token is never echoed"

"""`sluice mcp` over HTTP with MCP 2026-07-28 — no session: `server/discover`, then requests
that each carry their own protocol version and capabilities — driven by the official Python
SDK's modern client (`mcp.Client`) against a real `sluice dev`: journal positions come from the
request's `_meta` (a named position works on any replica, a named conversation counts like a
session), the Tasks extension answers calls that wait, and `_meta.traceparent` joins the
caller's trace."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import quote

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_AGENT_TOKEN,
    SLOW_CALLS,
    SLOW_TRACES,
    SLUICE,
    Sluice,
    api,
)
from test_mcp import EMAIL, effects_of, facts, http_server, is_error

pytestmark = pytest.mark.anyio

TASKS = "io.modelcontextprotocol/tasks"


def big_wire(run_id: str) -> dict[str, Any]:
    """A wire over the approval threshold, its own (the business key holds the beneficiary)."""
    return {"account": "acc-1", "amount_minor": 5_000_000, "beneficiary": f"b-{run_id}",
            "date": "2026-11-25"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The Tasks extension (SEP-2663) as the SDK lets a client take part in it: a claim on the
# `task` result of tools/call, and tasks/get and tasks/cancel sent as the extension's requests.
class TaskHandle(types.Result):
    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskState(types.Result):
    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


async def get_task(client: Client, task_id: str) -> TaskState:
    return await client.session.send_request(GetTask(params=TaskParams(task_id=task_id)), TaskState)


async def until_settled(client: Client, task_id: str, within_s: float = 30) -> TaskState:
    end = time.monotonic() + within_s
    while True:
        state = await get_task(client, task_id)
        if state.status != "working":
            return state
        assert time.monotonic() < end, f"task {task_id} still working: {state}"
        await anyio.sleep(0.3)


async def resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    """Polls the task to its end and gives its tool result, as a tasks-aware host would."""
    end = time.monotonic() + 30
    while True:
        state = await ctx.session.send_request(
            GetTask(params=TaskParams(task_id=handle.task_id)), TaskState)
        if state.status == "completed":
            assert state.result is not None, state
            return types.CallToolResult.model_validate(state.result)
        assert state.status == "working", state
        assert time.monotonic() < end, state
        await anyio.sleep((handle.poll_interval_ms or 500) / 1000)


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


@contextlib.asynccontextmanager
async def modern(url: str, token: str, tasks: bool = False) -> AsyncIterator[Client]:
    """The SDK's `mcp.Client`, negotiating itself (it probes `server/discover` first)."""
    http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, extensions=[Tasks()] if tasks else None) as client:
        assert client.protocol_version == "2026-07-28", client.protocol_version
        yield client


def new_run() -> str:
    return f"r-mcp-{uuid.uuid4().hex[:8]}"


def at(run_id: str, **more: Any) -> dict[str, Any]:
    return {"dev.sluice/run_id": run_id, **{f"dev.sluice/{k}": v for k, v in more.items()}}


async def test_the_sdk_s_modern_client_is_served_without_a_session(sluice: Sluice) -> None:
    """The SDK's client negotiates 2026-07-28 (no handshake, no session); a conversation it
    names counts positions like a session, and a new conversation re-drives the run."""
    run_id = new_run()
    ticket = {"title": f"stateless ({run_id})"}
    keys = []
    with http_server(sluice) as url:
        for conversation in ("first", "re-driven"):
            async with modern(url, AGENT_TOKEN) as client:
                assert "email__send" in {t.name for t in (await client.list_tools()).tools}
                meta = at(run_id, conversation=f"{run_id}-{conversation}")
                first = facts(await client.call_tool("tickets__create", ticket, meta=meta))
                second = facts(await client.call_tool("tickets__create", ticket, meta=meta))
                keys.append((first["command_key"], second["command_key"], first["external_ref"]))
    assert [k[:2] for k in keys] == [("d-1/tickets/create/0", "d-1/tickets/create/1")] * 2, keys
    assert keys[0][2] == keys[1][2], "the re-drive got the stored result"
    assert len(effects_of(sluice, run_id)) == 2


async def test_a_stateless_call_must_name_its_position_or_conversation(sluice: Sluice) -> None:
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN) as client:
            with pytest.raises(Exception) as unordered:
                await client.call_tool("email__send", EMAIL, meta=at(run_id))
            with pytest.raises(Exception) as no_run:
                await client.call_tool("email__send", EMAIL, meta={"dev.sluice/call": 0})
            with pytest.raises(Exception) as bad_id:
                await client.call_tool("email__send", EMAIL, meta=at(run_id, conversation="a b"))
    assert "dev.sluice/call" in str(unordered.value), unordered.value
    assert "dev.sluice/conversation" in str(unordered.value), unordered.value
    assert "dev.sluice/run_id" in str(no_run.value), no_run.value
    assert "conversation id" in str(bad_id.value), bad_id.value
    assert effects_of(sluice, run_id) == []


async def test_a_named_position_is_the_same_key_on_any_replica(sluice: Sluice) -> None:
    """Two `sluice mcp` replicas remember nothing of each other: a call naming its position
    gets the same key on either, so a retry through another replica gets the stored result."""
    run_id = new_run()
    meta = at(run_id, decision=2, call=0)
    with http_server(sluice) as one, http_server(sluice) as other:
        async with modern(one, AGENT_TOKEN) as client:
            first = facts(await client.call_tool("email__send", EMAIL, meta=meta))
        async with modern(other, AGENT_TOKEN) as client:
            retried = facts(await client.call_tool("email__send", EMAIL, meta=meta))
    assert first["command_key"] == retried["command_key"] == "d-2/email/send/0"
    assert retried["external_ref"] == first["external_ref"]
    assert len(effects_of(sluice, run_id)) == 1


async def test_a_stateless_retry_after_the_client_gave_up_takes_the_same_position(
        sluice: Sluice) -> None:
    """Without a session, the client's timeout closes the request's stream; the same call in
    the same conversation is its retry, at the same position."""
    run_id = new_run()
    room = f"room-modern-{uuid.uuid4().hex[:6]}"
    meta = at(run_id, conversation=run_id)
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN) as client:
            with pytest.raises(Exception):
                await client.call_tool("lab__slow", {"room": room}, read_timeout_seconds=0.3,
                                       meta=meta)
            retried = await client.call_tool("lab__slow", {"room": room}, meta=meta)
            again = await client.call_tool("lab__slow", {"room": room}, meta=meta)
    assert (facts(retried)["status"], facts(retried)["command_key"]) == (
        "CONFIRMED", "d-1/lab/slow/0")
    assert facts(again)["command_key"] == "d-1/lab/slow/1"
    assert SLOW_CALLS[room] == 2, "the retry did not reach the upstream again"


async def test_a_call_waiting_for_approval_is_a_task_that_completes_once_approved(
        sluice: Sluice) -> None:
    """A client that takes tasks gets one for a wire over the approval threshold; the task
    works while the command waits, a person approves it through the API, and the task
    completes with the tool result."""
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN, tasks=True) as client:
            handle = await client.session.call_tool(
                "payments__wire", big_wire(run_id), meta=at(run_id, call=0), allow_claimed=True)
            assert isinstance(handle, TaskHandle), handle
            assert handle.task_id == f"{run_id}/d-1/payments/wire/0"
            assert handle.status == "working" and "approve" in (handle.status_message or "")
            waiting = await get_task(client, handle.task_id)
            assert waiting.status == "working" and waiting.result is None, waiting

            key = quote("d-1/payments/wire/0", safe="")
            api(sluice, "POST", f"/v1/runs/{run_id}/effects/{key}:approve", ADMIN_TOKEN,
                {"reason": "checked with the beneficiary"})
            done = await until_settled(client, handle.task_id)
    assert done.status == "completed", done
    result = types.CallToolResult.model_validate(done.result)
    assert not result.is_error, result
    assert result.structured_content["status"] == "CONFIRMED", result
    assert [e["status"] for e in effects_of(sluice, run_id)] == ["CONFIRMED"]


async def test_a_scheduled_call_is_a_task_the_sdk_resolves(sluice: Sluice) -> None:
    """A call delayed past the task wait (`dev.sluice/delay_ms`) is answered with a task at
    once; the SDK's claim polls it, and `call_tool` returns the result once it ran."""
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN, tasks=True) as client:
            started = time.monotonic()
            result = await client.call_tool(
                "email__send", EMAIL, meta=at(run_id, call=0, delay_ms=7000))
            took = time.monotonic() - started
    assert not is_error(result), result
    assert facts(result)["status"] == "CONFIRMED", result
    assert took >= 6.5, f"it ran when due, not at once ({took:.1f} s)"


async def test_a_task_id_is_no_authorisation(sluice: Sluice) -> None:
    """Every task read and cancel goes to the API with the caller's own token: another agent
    is refused, an agent may not cancel (an admin's act), and an admin's cancel cancels."""
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN, tasks=True) as client:
            handle = await client.session.call_tool(
                "payments__wire", big_wire(run_id), meta=at(run_id, call=0), allow_claimed=True)
            assert isinstance(handle, TaskHandle), handle
            with pytest.raises(Exception) as not_an_admin:
                await client.session.send_request(
                    CancelTask(params=TaskParams(task_id=handle.task_id)), types.EmptyResult)
            with pytest.raises(Exception) as not_a_task:
                await get_task(client, "not-a-task")
        async with modern(url, OTHER_AGENT_TOKEN, tasks=True) as other:
            with pytest.raises(Exception) as not_theirs:
                await get_task(other, handle.task_id)
        async with modern(url, ADMIN_TOKEN, tasks=True) as admin:
            await admin.session.send_request(
                CancelTask(params=TaskParams(task_id=handle.task_id)), types.EmptyResult)
            cancelled = await get_task(admin, handle.task_id)
    assert "403" in str(not_an_admin.value), not_an_admin.value
    assert "<run_id>/<command_key>" in str(not_a_task.value), not_a_task.value
    assert "refused" in str(not_theirs.value), not_theirs.value
    assert cancelled.status == "cancelled", cancelled
    assert [e["status"] for e in effects_of(sluice, run_id)] == ["CANCELLED"]


async def test_an_outcome_nobody_knows_yet_is_a_task_that_says_so(sluice: Sluice) -> None:
    """A call whose upstream hangs and cannot be asked (UNKNOWN, then STUCK for a person) is a
    task that keeps working, its status message saying a person must settle it."""
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN, tasks=True) as client:
            handle = await client.session.call_tool(
                "lab__stall", {"slot": f"s-{run_id}"}, meta=at(run_id, call=0),
                allow_claimed=True)
            assert isinstance(handle, TaskHandle), handle
            end = time.monotonic() + 30
            while True:
                state = await get_task(client, handle.task_id)
                assert state.status == "working", state
                if "person must settle" in (state.status_message or ""):
                    break
                assert time.monotonic() < end, state
                await anyio.sleep(0.3)
    assert [e["status"] for e in effects_of(sluice, run_id)] == ["STUCK"]


async def test_the_modern_client_over_stdio_is_one_conversation(sluice: Sluice) -> None:
    """Over stdio the SDK's default client negotiates 2026-07-28 too; the process is the
    conversation, and a new process re-drives the run."""
    run_id = new_run()
    params = StdioServerParameters(
        command=SLUICE,
        args=["mcp", "--url", sluice.url, "--run-id", run_id, "--max-wait-s", "20"],
        env={"SLUICE_TOKEN": AGENT_TOKEN, "RUST_LOG": "warn"},
    )
    answers = []
    for _ in range(2):
        async with Client(params) as client:
            assert client.protocol_version == "2026-07-28", client.protocol_version
            first = facts(await client.call_tool("email__send", EMAIL))
            second = facts(await client.call_tool("email__send", EMAIL))
            answers.append((first["command_key"], second["command_key"], first["external_ref"]))
    assert [a[:2] for a in answers] == [("d-1/email/send/0", "d-1/email/send/1")] * 2, answers
    assert answers[0][2] == answers[1][2], "the re-drive got the stored result"
    assert len(effects_of(sluice, run_id)) == 2


async def test_a_client_without_tasks_is_answered_as_before(sluice: Sluice) -> None:
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN) as client:
            blocked = await client.call_tool("payments__wire", big_wire(run_id), meta=at(run_id, call=0))
    assert facts(blocked)["status"] == "BLOCKED", blocked


async def test_calls_that_do_not_wait_are_answered_at_once_to_a_tasks_client(
        sluice: Sluice) -> None:
    """A task is for a command still to finish: a call that settles within the wait, and a
    call Sluice refuses (nothing recorded), are answered as to any client."""
    run_id = new_run()
    with http_server(sluice) as url:
        async with modern(url, AGENT_TOKEN, tasks=True) as client:
            done = await client.session.call_tool(
                "email__send", EMAIL, meta=at(run_id, call=0), allow_claimed=True)
            refused = await client.session.call_tool(
                "email__send", {"to": "not an address"}, meta=at(run_id, call=1),
                allow_claimed=True)
    assert isinstance(done, types.CallToolResult) and facts(done)["status"] == "CONFIRMED", done
    assert isinstance(refused, types.CallToolResult) and is_error(refused), refused
    assert facts(refused)["status"] == "REFUSED", refused


@pytest.mark.parametrize("era", ["modern", "handshake"])
async def test_the_caller_s_traceparent_reaches_the_upstream(sluice: Sluice, era: str) -> None:
    """`_meta.traceparent` is the caller's trace: the command keeps it, and the upstream's
    request carries the same trace id (under a span of Sluice's)."""
    run_id = new_run()
    room = f"room-trace-{era}-{uuid.uuid4().hex[:6]}"
    trace_id = uuid.uuid4().hex
    meta = {**at(run_id, call=0), "traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01",
            "tracestate": "agent=1"}
    with http_server(sluice) as url:
        if era == "modern":
            async with modern(url, AGENT_TOKEN) as client:
                result = await client.call_tool("lab__slow", {"room": room}, meta=meta)
        else:
            http = create_mcp_http_client(headers={"authorization": f"Bearer {AGENT_TOKEN}"})
            transport = streamable_http_client(url, http_client=http)
            async with http, Client(transport, mode="legacy") as client:
                assert client.protocol_version != "2026-07-28"
                result = await client.call_tool("lab__slow", {"room": room}, meta=meta)
    assert facts(result)["status"] == "CONFIRMED", result
    seen = SLOW_TRACES[room]
    assert len(seen) == 1 and seen[0].split("-")[1] == trace_id, (trace_id, seen)


async def test_a_token_sluice_does_not_know_is_refused_at_discover(sluice: Sluice) -> None:
    with http_server(sluice) as url:
        with pytest.raises(Exception) as refused:
            async with modern(url, "not-a-known-token-at-all"):
                pass
    said = repr(refused.value)
    assert "not recognised" in said, said
    assert "not-a-known-token-at-all" not in said

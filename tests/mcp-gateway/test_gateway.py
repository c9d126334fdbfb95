"""The gateway end to end: effects submitted to a real `sluice dev` whose catalog's
`[mcp_servers.*]` are real third-party MCP servers (conftest.py), with faults injected between
them, each outcome checked against the server's own state."""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import time
import urllib.parse
import uuid
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import ADMIN_TOKEN, AGENT_TOKEN, GIT_SECRET, MEMORY_TOKEN, SLUICE, World, api, new_run, settle, submit

COMMIT_TEXT = re.compile(r"Changes committed successfully with hash ([0-9a-f]{40})")


def stage(world: World, name: str) -> None:
    """A change for git_commit to record (the server refuses to make an empty commit)."""
    (world.repo / name).write_text(f"{name}\n")
    world.git("add", name)


def commits_with(world: World, text: str) -> list[str]:
    """Commits whose message holds `text`, from the repository's own log."""
    log = world.git("log", "--format=%H%x01%B%x00")
    return [entry.split("\x01", 1)[0].strip() for entry in log.split("\0")
            if "\x01" in entry and text in entry.split("\x01", 1)[1]]


def result_text(command: dict[str, Any]) -> str:
    return repr(command.get("result"))


def key_line(command: dict[str, Any]) -> str:
    return f"Sluice-Key: {command['idempotency_key']}"


# ------------------------------------------------------------------ catalog ---

def test_only_allowed_tools_are_exposed_with_semantics_from_annotations_or_the_catalog(world: World) -> None:
    status, listing = api(world, "GET", "/v1/tools", AGENT_TOKEN)
    assert status == 200, listing
    tools = {tool["name"]: tool for tool in listing["tools"]}
    mcp = {name for name in tools if name.split("/")[0] in ("git", "git_http", "files", "memory")}
    assert mcp == {
        "git/git_status", "git/git_add", "git/git_log", "git/git_commit", "git/git_create_branch",
        "git/git_branch", "files/write_file", "files/edit_file", "files/read_text_file",
        "files/create_directory", "memory/create_entities", "memory/add_observations",
        "memory/create_relations", "memory/open_nodes", "memory/search_nodes", "git_http/git_log",
        "git_http/git_commit",
    }, "exactly the allow-lists; git_checkout, move_file, delete_entities… are not exposed"
    # From the servers' annotations (readOnlyHint → OBSERVE_ONLY, idempotentHint → IDEMPOTENT):
    assert tools["git/git_log"]["semantics"] == "OBSERVE_ONLY"
    assert tools["git/git_commit"]["semantics"] == "NON_IDEMPOTENT"
    assert tools["git/git_add"]["semantics"] == "IDEMPOTENT"
    assert tools["files/write_file"]["semantics"] == "IDEMPOTENT"
    assert tools["files/edit_file"]["semantics"] == "NON_IDEMPOTENT"
    assert tools["memory/create_entities"]["semantics"] == "NON_IDEMPOTENT"
    # … and the catalog's override over the server's idempotentHint = false:
    assert tools["memory/add_observations"]["semantics"] == "IDEMPOTENT"
    assert tools["memory/add_observations"]["semantics_source"] == "catalog"
    assert tools["memory/create_entities"]["semantics_source"] == "annotation"
    assert {tools[name]["mcp_server"] for name in mcp} == {"git", "git_http", "files", "memory"}
    assert tools["git/git_commit"]["mcp_server"] == "git"
    assert tools["git/git_commit"]["status_check"] is True
    assert tools["memory/create_entities"]["status_check"] is True
    assert tools["memory/create_relations"]["semantics"] == "NON_IDEMPOTENT"
    assert tools["memory/create_relations"]["status_check"] is False
    # The server's own input schema is the tool's.
    assert set(tools["git/git_commit"]["args_schema"]["required"]) == {"repo_path", "message"}


def test_a_tool_not_allowed_cannot_be_called(world: World) -> None:
    head = world.git("rev-parse", "HEAD")
    status, answer = api(world, "POST", "/v1/effects", AGENT_TOKEN, {
        "run_id": new_run(), "decision": 1, "tool": "git/git_checkout", "call_idx": 0,
        "args": {"repo_path": str(world.repo), "branch_name": "main"}})
    assert status == 404, answer
    assert world.git("rev-parse", "HEAD") == head
    assert world.git_faults.calls("git_checkout") == [], "nothing reached the server"


def test_arguments_are_checked_against_the_servers_schema(world: World) -> None:
    status, answer = api(world, "POST", "/v1/effects", AGENT_TOKEN, {
        "run_id": new_run(), "decision": 1, "tool": "git/git_commit", "call_idx": 0,
        "args": {"repo_path": str(world.repo)}})
    assert status == 422, answer
    assert "message" in repr(answer)


# ---------------------------------------------------------------------- git ---

def test_a_commit_carries_its_key_and_a_re_driven_call_gets_the_stored_result(world: World) -> None:
    stage(world, "once.txt")
    run = new_run()
    args = {"repo_path": str(world.repo), "message": "add once.txt"}
    done = submit(world, run, "git/git_commit", args)
    assert done["status"] == "CONFIRMED", done
    (sha,) = commits_with(world, key_line(done))
    found = COMMIT_TEXT.search(result_text(done))
    assert found and found.group(1) == sha, "the result is the server's answer"
    message = world.git("log", "-1", "--format=%B", sha)
    assert message.startswith("add once.txt\n\nSluice-Key: "), "set_arguments rewrote the message"
    (call,) = world.git_faults.calls("git_commit", done["idempotency_key"])
    meta = call["meta"]["_meta"]
    assert meta["dev.sluice/run_id"] == run
    assert meta["dev.sluice/command_key"] == done["command_key"]

    # The same run and position again: the stored result, no second call, no second commit.
    stage(world, "twice.txt")
    again = submit(world, run, "git/git_commit", args)
    assert again["command_key"] == done["command_key"] and again["status"] == "CONFIRMED"
    assert again["result"] == done["result"]
    assert len(world.git_faults.calls("git_commit", done["idempotency_key"])) == 1
    assert len(commits_with(world, key_line(done))) == 1
    assert "twice.txt" in world.git("diff", "--cached", "--name-only"), "still staged, not committed"
    world.git("reset", "-q")
    (world.repo / "twice.txt").unlink()


def test_the_callers_trace_reaches_the_server_in_meta(world: World) -> None:
    stage(world, "traced.txt")
    trace_id = uuid.uuid4().hex
    traceparent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
    run = new_run()
    status, command = api(
        world, "POST", "/v1/effects", AGENT_TOKEN,
        {"run_id": run, "decision": 1, "tool": "git/git_commit", "call_idx": 0,
         "args": {"repo_path": str(world.repo), "message": "traced"}},
        headers={"prefer": "wait=30", "traceparent": traceparent},
    )
    assert status in (200, 201, 202), command
    done = settle(world, command)
    assert done["status"] == "CONFIRMED", done
    (call,) = world.git_faults.calls("git_commit", done["idempotency_key"])
    sent = call["meta"]["_meta"]["traceparent"]
    assert sent.split("-")[1] == trace_id, "the same trace, continued by Sluice's own span"


def test_a_commit_whose_answer_is_dropped_is_looked_up_and_confirmed_once(world: World) -> None:
    stage(world, "dropped.txt")
    (rule,) = world.git_faults.set({"tool": "git_commit", "nth": 1, "action": "drop"})
    done = submit(world, new_run(), "git/git_commit", {"repo_path": str(world.repo), "message": "dropped answer"})
    world.git_faults.clear()
    assert world.git_faults.fired(rule) == ["armed", "dropped"], "the fault happened"
    assert done["status"] == "CONFIRMED", done
    assert done.get("ambiguous_before") is True, "it went through UNKNOWN"
    assert len(commits_with(world, key_line(done))) == 1, "exactly one commit"
    assert len(world.git_faults.calls("git_commit", done["idempotency_key"])) == 1, "never sent twice"
    assert world.git_faults.calls("git_log"), "the lookup went through git_log"


def test_a_commit_whose_server_is_killed_mid_call_is_confirmed_once(world: World) -> None:
    stage(world, "killed.txt")
    (rule,) = world.git_faults.set({"tool": "git_commit", "nth": 1, "action": "kill"})
    done = submit(world, new_run(), "git/git_commit", {"repo_path": str(world.repo), "message": "killed mid-call"})
    world.git_faults.clear()
    assert world.git_faults.fired(rule) == ["armed", "killed"]
    assert done["status"] == "CONFIRMED", done
    assert len(commits_with(world, key_line(done))) == 1
    assert len(world.git_faults.calls("git_commit", done["idempotency_key"])) == 1
    # The server was started again for the lookup (and runs on).
    assert sum(1 for e in world.git_faults.events() if e["event"] == "started") >= 2


def test_a_server_killed_before_it_acted_is_found_absent_and_called_again(world: World) -> None:
    stage(world, "early.txt")
    # Killed the moment the request is written: git_commit cannot have finished by then
    # (GitPython first reads the index); the lookup finds nothing and the commit is sent again.
    (rule,) = world.git_faults.set({"tool": "git_commit", "nth": 1, "action": "kill", "when": "request"})
    done = submit(world, new_run(), "git/git_commit", {"repo_path": str(world.repo), "message": "killed early"})
    world.git_faults.clear()
    assert world.git_faults.fired(rule) == ["armed", "killed"]
    assert done["status"] == "CONFIRMED", done
    assert len(commits_with(world, key_line(done))) == 1, "exactly one commit, whichever way it went"


def test_a_lost_request_is_not_taken_for_a_later_call_whose_key_it_prefixes(world: World) -> None:
    run = new_run()
    stage(world, "call-10.txt")
    tenth = submit(world, run, "git/git_commit", {"repo_path": str(world.repo), "message": "call 10"}, call_idx=10)
    assert tenth["status"] == "CONFIRMED", tenth
    stage(world, "call-1.txt")
    # Call 1's request never reaches the server; its key is a prefix of call 10's, already in
    # the log: the lookup must still find call 1 absent, and call 1 be sent again.
    (rule,) = world.git_faults.set({"tool": "git_commit", "nth": 1, "action": "lose"})
    first = submit(world, run, "git/git_commit", {"repo_path": str(world.repo), "message": "call 1"}, call_idx=1)
    world.git_faults.clear()
    assert world.git_faults.fired(rule) == ["armed", "lost"]
    assert tenth["idempotency_key"].startswith(first["idempotency_key"])
    assert first["status"] == "CONFIRMED", first
    lines = world.git("log", "--format=%B").splitlines()
    assert lines.count(key_line(first)) == 1 and lines.count(key_line(tenth)) == 1
    assert "call-1.txt" in world.git("show", "--name-only", "--format=", "HEAD")


def http_commits_with(world: World, text: str) -> int:
    log = subprocess.run(["git", "-C", str(world.repo_http), "log", "--format=%B%x00"], check=True,
                         capture_output=True, text=True).stdout
    return sum(1 for message in log.split("\0") if text in message)


def test_over_http_a_lost_answer_and_a_killed_server_are_each_looked_up_and_confirmed_once(world: World) -> None:
    for action, name in (("drop", "http-dropped.txt"), ("kill", "http-killed.txt")):
        (world.repo_http / name).write_text(f"{name}\n")
        subprocess.run(["git", "-C", str(world.repo_http), "add", name], check=True)
        (rule,) = world.git_http_faults.set({"tool": "git_commit", "nth": 1, "action": action})
        done = submit(world, new_run(), "git_http/git_commit",
                      {"repo_path": str(world.repo_http), "message": f"over HTTP, {action}"})
        world.git_http_faults.clear()
        events = world.git_http_faults.events()
        armed = next(i for i, e in enumerate(events) if e.get("rule") == rule)
        # The proxy logs a drop under the rule; a kill as the bridge's death right after.
        assert any(e["event"] == ("dropped" if action == "drop" else "killed") for e in events[armed:]), action
        assert done["status"] == "CONFIRMED", (action, done)
        assert done.get("ambiguous_before") is True, action
        assert http_commits_with(world, key_line(done)) == 1, f"{action}: exactly one commit"
        answered = [e for e in world.git_http_faults.events()
                    if e["event"] == "answered" and e["tool"] == "git_commit"
                    and e.get("status") == 200]
        assert answered, "the commit reached the server over HTTP"
    kills = [e for e in world.git_http_faults.events() if e["event"] == "killed"]
    starts = [e for e in world.git_http_faults.events() if e["event"] == "upstream started"]
    assert len(kills) == 1 and len(starts) == 2, "the bridge was killed once and started again"


def test_is_error_reads_as_refused_and_nothing_is_committed(world: World) -> None:
    world.git("reset", "-q")  # nothing staged, whatever a test before left
    head = world.git("rev-parse", "HEAD")
    assert world.git("diff", "--cached", "--name-only") == ""
    done = submit(world, new_run(), "git/git_commit", {"repo_path": str(world.repo), "message": "nothing staged"})
    assert done["status"] == "FAILED", done
    assert "No changes staged" in repr(done), "the server's message is kept"
    assert world.git("rev-parse", "HEAD") == head


def test_the_models_own_key_argument_is_overwritten_with_the_key(world: World) -> None:
    done = submit(world, new_run(), "git/git_create_branch",
                  {"repo_path": str(world.repo), "branch_name": "the-models-own-name"})
    assert done["status"] == "CONFIRMED", done
    branches = world.git("branch", "--format=%(refname:short)").split()
    assert done["idempotency_key"] in branches
    assert "the-models-own-name" not in branches
    (call,) = world.git_faults.calls("git_create_branch", done["idempotency_key"])
    assert call["meta"]["arguments"]["branch_name"] == done["idempotency_key"]


# --------------------------------------------------------------- filesystem ---

def test_write_file_whose_answer_is_dropped_is_found_by_its_content(world: World) -> None:
    path = world.files / "notes.txt"
    content = f"written once {new_run()}\n"
    (rule,) = world.fs_faults.set({"tool": "write_file", "nth": 1, "action": "drop"})
    done = submit(world, new_run(), "files/write_file", {"path": str(path), "content": content})
    world.fs_faults.clear()
    assert world.fs_faults.fired(rule) == ["armed", "dropped"]
    assert done["status"] == "CONFIRMED", done
    assert path.read_text() == content
    assert len(world.fs_faults.calls("write_file", done["idempotency_key"])) == 1, "found, not re-sent"
    assert world.fs_faults.calls("read_text_file"), "looked up through read_text_file"


def test_concurrent_calls_share_one_server_process(world: World) -> None:
    from concurrent.futures import ThreadPoolExecutor

    run = new_run()
    paths = [world.files / f"many-{run}-{i}.txt" for i in range(8)]
    started_before = sum(1 for e in world.fs_faults.events() if e["event"] == "started")
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = list(pool.map(
            lambda i: submit(world, run, "files/write_file", {"path": str(paths[i]), "content": f"file {i}\n"},
                             call_idx=i),
            range(8)))
    assert [d["status"] for d in done] == ["CONFIRMED"] * 8, done
    assert [p.read_text() for p in paths] == [f"file {i}\n" for i in range(8)]
    assert len({d["idempotency_key"] for d in done}) == 8
    started_after = sum(1 for e in world.fs_faults.events() if e["event"] == "started")
    assert started_after == started_before, "no new server process: one connection carried them all"


def test_a_rollback_undoes_a_write_through_another_tool_of_the_server(world: World) -> None:
    path = world.files / f"draft-{uuid.uuid4().hex[:8]}.txt"
    run = new_run()
    done = submit(world, run, "files/write_file", {"path": str(path), "content": "a draft\n"})
    assert done["status"] == "CONFIRMED", done
    assert path.read_text() == "a draft\n"
    status, answer = api(world, "POST", f"/v1/runs/{run}/rollback", ADMIN_TOKEN, {"reason": "test"})
    assert status in (200, 202), answer
    undone = done
    end = time.monotonic() + 45
    while undone["status"] not in ("COMPENSATED", "COMPENSATION_FAILED", "NO_COMPENSATION") and time.monotonic() < end:
        time.sleep(0.2)
        undone = api(world, "GET", f"/v1/runs/{run}/effects/{urllib.parse.quote(done['command_key'], safe='')}")[1]
    assert undone["status"] == "COMPENSATED", undone
    assert not path.exists()
    assert pathlib.Path(f"{path}.rolled-back").read_text() == "a draft\n"
    (call,) = world.fs_faults.calls("move_file")[-1:]
    assert call["meta"]["arguments"] == {"source": str(path), "destination": f"{path}.rolled-back"}


def test_edit_file_with_no_lookup_whose_answer_is_dropped_waits_for_a_person(world: World) -> None:
    path = world.files / "list.txt"
    path.write_text("one\nEND\n")
    (rule,) = world.fs_faults.set({"tool": "edit_file", "nth": 1, "action": "drop"})
    done = submit(world, new_run(), "files/edit_file",
                  {"path": str(path), "edits": [{"oldText": "END", "newText": "two\nEND"}]})
    assert world.fs_faults.fired(rule) == ["armed", "dropped"]
    assert done["status"] == "STUCK", done
    # NON_IDEMPOTENT, no lookup: never called blindly again — the edit is in the file once.
    time.sleep(1)
    world.fs_faults.clear()
    assert len(world.fs_faults.calls("edit_file", done["idempotency_key"])) == 1
    assert path.read_text() == "one\ntwo\nEND\n"


def test_is_error_reads_as_unknown_where_the_catalog_says_so(world: World) -> None:
    path = world.files / "unchanged.txt"
    path.write_text("alpha\n")
    done = submit(world, new_run(), "files/edit_file",
                  {"path": str(path), "edits": [{"oldText": "no such text", "newText": "x"}]})
    assert done["status"] == "STUCK", done
    entries = api(world, "GET", f"/v1/runs/{done['run_id']}/audit")[1]["entries"]
    assert [e["to"] for e in entries if e["command_key"] == done["command_key"]][-2:] == ["UNKNOWN", "STUCK"]
    assert path.read_text() == "alpha\n"
    assert len(world.fs_faults.calls("edit_file", done["idempotency_key"])) == 1, "never re-sent blindly"


def test_a_path_outside_the_allowed_directory_is_refused(world: World) -> None:
    outside = world.root / "outside.txt"
    done = submit(world, new_run(), "files/write_file", {"path": str(outside), "content": "no"})
    assert done["status"] == "FAILED", done
    assert not outside.exists()


# ------------------------------------------------------- memory, over HTTP ---

def entities(world: World) -> list[dict[str, Any]]:
    return [line for line in world.graph() if line["type"] == "entity"]


def test_create_entities_over_http_carries_the_key_in_an_observation(world: World) -> None:
    name = f"person-{new_run()}"
    done = submit(world, new_run(), "memory/create_entities",
                  {"entities": [{"name": name, "entityType": "person", "observations": ["likes tea"]}]})
    assert done["status"] == "CONFIRMED", done
    assert [e["observations"] for e in entities(world) if e["name"] == name] == [
        ["likes tea", f"Sluice-Key: {done['idempotency_key']}"]], "appended by the JSON pointer rewrite"
    (call,) = world.memory_faults.calls("create_entities", done["idempotency_key"])
    assert call["meta"]["_meta"]["dev.sluice/command_key"] == done["command_key"]


def test_create_entities_whose_answer_is_dropped_over_http_is_found_by_its_key(world: World) -> None:
    name = f"dropped-{new_run()}"
    (rule,) = world.memory_faults.set({"tool": "create_entities", "nth": 1, "action": "drop"})
    done = submit(world, new_run(), "memory/create_entities",
                  {"entities": [{"name": name, "entityType": "person", "observations": []}]})
    world.memory_faults.clear()
    assert world.memory_faults.fired(rule) == ["armed", "dropped"]
    assert done["status"] == "CONFIRMED", done
    assert done.get("ambiguous_before") is True
    assert len([e for e in entities(world) if e["name"] == name]) == 1, "the server acted once"
    assert len(world.memory_faults.calls("create_entities", done["idempotency_key"])) == 1, "never re-sent"
    assert world.memory_faults.calls("open_nodes", done["idempotency_key"]), "looked up by open_nodes"


def test_a_relation_whose_answer_is_dropped_over_http_waits_for_a_person(world: World) -> None:
    a, b = f"a-{new_run()}", f"b-{new_run()}"
    (rule,) = world.memory_faults.set({"tool": "create_relations", "nth": 1, "action": "drop"})
    done = submit(world, new_run(), "memory/create_relations",
                  {"relations": [{"from": a, "to": b, "relationType": "knows"}]})
    assert world.memory_faults.fired(rule) == ["armed", "dropped"]
    assert done["status"] == "STUCK", done
    # NON_IDEMPOTENT by the server's hints and no lookup: never sent blindly again.
    time.sleep(1)
    world.memory_faults.clear()
    assert len(world.memory_faults.calls("create_relations", done["idempotency_key"])) == 1
    relations = [line for line in world.graph() if line["type"] == "relation" and line["from"] == a]
    assert relations == [{"type": "relation", "from": a, "to": b, "relationType": "knows"}]


def test_an_observation_declared_idempotent_is_sent_again_after_a_kill_and_kept_once(world: World) -> None:
    name = f"obs-{new_run()}"
    assert submit(world, new_run(), "memory/create_entities",
                  {"entities": [{"name": name, "entityType": "person", "observations": []}]})["status"] == "CONFIRMED"
    (rule,) = world.memory_faults.set({"tool": "add_observations", "nth": 1, "action": "kill"})
    done = submit(world, new_run(), "memory/add_observations",
                  {"observations": [{"entityName": name, "contents": ["met on tuesday"]}]})
    world.memory_faults.clear()
    assert world.memory_faults.fired(rule) == ["armed"]
    assert done["status"] == "CONFIRMED", done
    # Sent again (more than once if the restarted bridge first refuses the old session):
    assert len(world.memory_faults.calls("add_observations", done["idempotency_key"])) >= 2, "sent again"
    (entity,) = [e for e in entities(world) if e["name"] == name]
    assert entity["observations"].count("met on tuesday") == 1, "kept once by the server"


# ------------------------------------------------------------- sluice mcp ---

def test_git_through_sluice_mcp(world: World) -> None:
    """A model's MCP client (the official Python SDK) calling the git server's tools through
    `sluice mcp`: namespaced as `git__git_commit`, recorded and keyed like any other call."""
    stage(world, "via-mcp.txt")
    run = new_run()

    async def session_calls() -> tuple[set[str], Any]:
        params = StdioServerParameters(
            command=SLUICE, args=["mcp", "--url", world.url, "--run-id", run, "--max-wait-s", "30"],
            env={"SLUICE_TOKEN": AGENT_TOKEN, "RUST_LOG": "warn"})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = {tool.name for tool in (await session.list_tools()).tools}
                result = await session.call_tool(
                    "git__git_commit", {"repo_path": str(world.repo), "message": "through sluice mcp"})
                return names, result

    names, result = anyio.run(session_calls)
    assert {"git__git_commit", "git__git_log", "memory__create_entities", "files__write_file"} <= names
    assert "git__git_checkout" not in names
    assert not (getattr(result, "is_error", None) or getattr(result, "isError", None)), result
    status, listing = api(world, "GET", f"/v1/runs/{run}/effects", ADMIN_TOKEN)
    assert status == 200
    (effect,) = listing["effects"]
    assert effect["tool"] == "git/git_commit" and effect["status"] == "CONFIRMED"
    (sha,) = commits_with(world, key_line(effect))
    assert sha in repr(result.content)

    # The agent re-driven from the start (a new conversation naming the run): the same call at
    # the same position gets the stored answer, and nothing reaches the server.
    stage(world, "via-mcp-again.txt")
    _, again = anyio.run(session_calls)
    assert sha in repr(again.content)
    assert len(world.git_faults.calls("git_commit", effect["idempotency_key"])) == 1
    assert len(commits_with(world, key_line(effect))) == 1
    assert "via-mcp-again.txt" in world.git("diff", "--cached", "--name-only"), "still staged, not committed"
    world.git("reset", "-q")


# ---------------------------------------------------------------- secrets ---

def test_a_servers_credential_reaches_it_and_nowhere_else(world: World) -> None:
    stage(world, "secret.txt")
    run = new_run()
    done = submit(world, run, "git/git_commit", {"repo_path": str(world.repo), "message": "with a secret"})
    assert done["status"] == "CONFIRMED", done
    digest = hashlib.sha256(GIT_SECRET.encode()).hexdigest()
    started = [e for e in world.git_faults.events() if e["event"] == "started"]
    assert started and all(e["env_sha256"].get("GIT_SERVICE_TOKEN") == digest for e in started), \
        "env_credentials gave the server its secret"
    assert all("SLUICE_GW_GIT_SECRET" not in e["env_sha256"] for e in started), \
        "the server is not handed Sluice's own environment, where the secret came from"
    seen = {
        "the effect and its evidence": repr(api(world, "GET", f"/v1/runs/{run}/effects")[1]),
        "the audit chain": repr(api(world, "GET", f"/v1/runs/{run}/audit")[1]),
        "the tools listing": repr(api(world, "GET", "/v1/tools")[1]),
        "sluice dev's log": world.log.read_text(errors="replace"),
        "what the server was sent": repr(world.git_faults.events()),
    }
    for where, text in seen.items():
        assert GIT_SECRET not in text, f"the secret is in {where}"


def test_an_http_servers_credential_is_sent_with_every_call_and_kept_out_of_sight(world: World) -> None:
    run = new_run()
    done = submit(world, run, "memory/create_entities",
                  {"entities": [{"name": f"cred-{run}", "entityType": "t", "observations": []}]})
    assert done["status"] == "CONFIRMED", done
    digest = hashlib.sha256(f"Bearer {MEMORY_TOKEN}".encode()).hexdigest()
    calls = world.memory_faults.calls("create_entities")
    assert calls and all(c["header_sha256"].get("Authorization") == digest for c in calls), \
        "every call carried the credential"
    seen = {
        "the effect and its evidence": repr(api(world, "GET", f"/v1/runs/{run}/effects")[1]),
        "the audit chain": repr(api(world, "GET", f"/v1/runs/{run}/audit")[1]),
        "the tools listing": repr(api(world, "GET", "/v1/tools")[1]),
        "sluice dev's log": world.log.read_text(errors="replace"),
    }
    for where, text in seen.items():
        assert MEMORY_TOKEN not in text, f"the token is in {where}"

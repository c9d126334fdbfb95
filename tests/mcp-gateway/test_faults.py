"""The fault injectors themselves, against the real servers with no Sluice in between: a raw
JSON-RPC exchange over stdio with mcp-server-git through the wrapper, and the MCP SDK's client
over streamable HTTP with server-memory behind mcp-proxy through the fault proxy. They prove
that a dropped answer is dropped *after the server acted*, and that a kill lands mid-call — what
the gateway tests rely on."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from conftest import PROXY, WRAPPER, Faults


def git_repo(path: pathlib.Path) -> pathlib.Path:
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    for key, value in (("user.name", "Test"), ("user.email", "test@example.com")):
        subprocess.run(["git", "-C", str(path), "config", key, value], check=True)
    (path / "a").write_text("a\n")
    subprocess.run(["git", "-C", str(path), "add", "a"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "initial"], check=True)
    (path / "b").write_text("b\n")
    subprocess.run(["git", "-C", str(path), "add", "b"], check=True)
    return path


class Stdio:
    """A raw newline-delimited JSON-RPC client of a stdio server."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next_id = 1

    def send(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> int:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            message["id"] = self.next_id
            self.next_id += 1
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()
        return message.get("id", 0)

    def answer(self) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def initialize(self) -> None:
        self.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "gwtests", "version": "0"}})
        assert self.answer()["result"]["serverInfo"]["name"] == "mcp-git"
        self.send("notifications/initialized", notify=True)


def commits(repo: pathlib.Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%B%x00"], check=True,
                         capture_output=True, text=True).stdout
    return [c.strip() for c in out.split("\0") if c.strip()]


def wrapped_git(faults: Faults, repo: pathlib.Path, servers: pathlib.Path) -> Stdio:
    return Stdio([sys.executable, str(WRAPPER), "--control", str(faults.path), "--",
                  str(servers / "mcp-server-git"), "--repository", str(repo)])


def test_without_a_rule_the_wrapper_is_a_plain_pipe(tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    repo = git_repo(tmp_path / "repo")
    faults = Faults(tmp_path / "faults.json")
    client = wrapped_git(faults, repo, servers)
    client.initialize()
    client.send("tools/call", {"name": "git_commit", "arguments": {"repo_path": str(repo), "message": "plain"}})
    answer = client.answer()
    assert answer is not None and "Changes committed successfully" in answer["result"]["content"][0]["text"]
    client.process.stdin.close()
    assert client.process.wait(timeout=20) == 0
    assert commits(repo)[0] == "plain"


def test_the_wrapper_drops_the_answer_after_the_server_acted(tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    repo = git_repo(tmp_path / "repo")
    faults = Faults(tmp_path / "faults.json")
    (rule,) = faults.set({"tool": "git_commit", "nth": 1, "action": "drop"})
    client = wrapped_git(faults, repo, servers)
    client.initialize()
    client.send("tools/call", {"name": "git_status", "arguments": {"repo_path": str(repo)}})
    assert "Repository status" in client.answer()["result"]["content"][0]["text"], "other tools pass"
    client.send("tools/call", {"name": "git_commit", "arguments": {"repo_path": str(repo), "message": "dropped"}})
    assert client.answer() is None, "the stream closed with no answer"
    client.process.wait(timeout=20)
    assert commits(repo)[0] == "dropped", "the server acted before its answer was dropped"
    assert faults.fired(rule) == ["armed", "dropped"]
    dropped = next(e for e in faults.events() if e["event"] == "dropped")
    assert "Changes committed successfully" in dropped["answer"]


def test_the_wrapper_loses_a_request_before_the_server_sees_it(tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    repo = git_repo(tmp_path / "repo")
    faults = Faults(tmp_path / "faults.json")
    (rule,) = faults.set({"tool": "git_commit", "nth": 1, "action": "lose"})
    client = wrapped_git(faults, repo, servers)
    client.initialize()
    client.send("tools/call", {"name": "git_commit", "arguments": {"repo_path": str(repo), "message": "lost"}})
    assert client.answer() is None
    client.process.wait(timeout=20)
    assert commits(repo) == ["initial"], "the server never saw it"
    assert faults.fired(rule) == ["armed", "lost"]


@pytest.mark.parametrize("when", ["answer", "request"])
def test_the_wrapper_kills_the_server_mid_call(tmp_path: pathlib.Path, servers: pathlib.Path, when: str) -> None:
    repo = git_repo(tmp_path / "repo")
    faults = Faults(tmp_path / "faults.json")
    (rule,) = faults.set({"tool": "git_commit", "nth": 2, "action": "kill", "when": when, "delay_ms": 0})
    client = wrapped_git(faults, repo, servers)
    client.initialize()
    client.send("tools/call", {"name": "git_commit", "arguments": {"repo_path": str(repo), "message": "first"}})
    assert client.answer()["result"]["isError"] is False, "the first commit is not the nth"
    (repo / "c").write_text("c\n")
    subprocess.run(["git", "-C", str(repo), "add", "c"], check=True)
    client.send("tools/call", {"name": "git_commit", "arguments": {"repo_path": str(repo), "message": "second"}})
    assert client.answer() is None
    assert client.process.wait(timeout=20) == 137
    assert faults.fired(rule) == ["armed", "killed"]
    if when == "answer":
        assert commits(repo)[0] == "second", "killed once it had acted"
    # With when = "request" the server died right after the request reached it: whether it
    # committed is what nobody can know — exactly the ambiguity the gateway must settle.
    assert commits(repo).count("second") <= 1


def test_rule_counts_survive_a_restarted_wrapper(tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    repo = git_repo(tmp_path / "repo")
    faults = Faults(tmp_path / "faults.json")
    (rule,) = faults.set({"tool": "git_status", "nth": 2, "action": "drop"})
    for expect_answer in (True, False, True):
        client = wrapped_git(faults, repo, servers)
        client.initialize()
        client.send("tools/call", {"name": "git_status", "arguments": {"repo_path": str(repo)}})
        assert (client.answer() is not None) == expect_answer
        client.process.stdin.close()
        client.process.wait(timeout=20)
    assert faults.fired(rule) == ["armed", "dropped"], "fired once, on the 2nd call overall"


def test_the_http_proxy_drops_an_answer_and_kills_the_bridge(tmp_path: pathlib.Path, servers: pathlib.Path) -> None:
    memory_file = tmp_path / "memory.jsonl"
    faults = Faults(tmp_path / "faults.json")
    drop, kill = faults.set({"tool": "create_entities", "nth": 2, "action": "drop"},
                            {"tool": "add_observations", "nth": 1, "action": "kill"})
    proxy = subprocess.Popen(
        [sys.executable, str(PROXY), "--control", str(faults.path), "--", str(servers / "mcp-proxy"),
         "--port", "{port}", "--log-level", "WARNING", "-e", "MEMORY_FILE_PATH", str(memory_file), "--",
         str(servers / "mcp-server-memory")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        url = proxy.stdout.readline().strip().rsplit(" ", 1)[-1] + "/mcp"
        outcomes: list[str] = []

        async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> None:
            try:
                with anyio.fail_after(15):
                    result = await session.call_tool(tool, args)
                outcomes.append("error" if result.is_error else "ok")
            except Exception:  # noqa: BLE001 (any failure to answer is what is counted)
                outcomes.append("no answer")

        async def exchange() -> None:
            for tool, args in (
                ("create_entities", {"entities": [{"name": "a", "entityType": "t", "observations": ["o"]}]}),
                ("create_entities", {"entities": [{"name": "b", "entityType": "t", "observations": ["o"]}]}),
                ("add_observations", {"observations": [{"entityName": "a", "contents": ["p"]}]}),
                ("open_nodes", {"names": ["a", "b"]}),
            ):
                # A fresh session per call: a cut connection may end the SDK's session.
                try:
                    async with streamable_http_client(url) as (read, write):
                        async with ClientSession(read, write) as session:
                            with anyio.fail_after(15):
                                await session.initialize()
                            await call(session, tool, args)
                except Exception:  # noqa: BLE001
                    if len(outcomes) < 4:
                        outcomes.append("no answer")

        anyio.run(exchange)
        assert outcomes[:3] == ["ok", "no answer", "no answer"], outcomes
        assert faults.fired(drop) == ["armed", "dropped"]
        assert faults.fired(kill) == ["armed"] and any(e["event"] == "killed" for e in faults.events())
        names = [line["name"] for line in map(json.loads, memory_file.read_text().splitlines())
                 if line["type"] == "entity"]
        assert names == ["a", "b"], "the dropped create_entities ran"
        assert outcomes[3] == "ok", "the bridge was started again after the kill"
    finally:
        proxy.terminate()
        proxy.wait(timeout=20)

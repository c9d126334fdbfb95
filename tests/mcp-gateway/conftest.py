"""A real Sluice in front of MCP servers nobody here wrote, installed from the registries by
scripts/mcp-servers/install.sh: mcp-server-git (PyPI) and @modelcontextprotocol/server-filesystem
(npm) over stdio through the fault wrapper (faults/wrapper.py), and
@modelcontextprotocol/server-memory (npm) over streamable HTTP — served by mcp-proxy (PyPI), a
stdio↔HTTP bridge — through the HTTP fault proxy (faults/proxy.py). `sluice dev` runs on loopback
with a catalog of `[mcp_servers.*]` only; each test chooses its faults by writing the server's
control file, and checks what happened against the server's own state: the repository (`git`),
the graph file (MEMORY_FILE_PATH), the files."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
SLUICE = os.environ.get("SLUICE_BIN") or str(REPO / "target" / "debug" / "sluice")
WRAPPER = HERE / "faults" / "wrapper.py"
PROXY = HERE / "faults" / "proxy.py"
AGENT_TOKEN = "gw-agent-token-0123456789"
GIT_SECRET = f"gw-git-secret-{uuid.uuid4().hex}"
MEMORY_TOKEN = f"gw-memory-token-{uuid.uuid4().hex}"
ADMIN_TOKEN = "gw-admin-token-0123456789"
# How long a test waits for an effect to settle (the suite's whole budget is a few minutes).
SETTLE_S = 45


def servers_bin() -> pathlib.Path:
    """Where install.sh put the servers (it prints the directory last): SLUICE_MCP_SERVERS_BIN
    when the suite's script ran it already."""
    given = os.environ.get("SLUICE_MCP_SERVERS_BIN")
    if given:
        return pathlib.Path(given)
    out = subprocess.run(
        [str(REPO / "scripts" / "mcp-servers" / "install.sh")], check=True, capture_output=True, text=True
    ).stdout
    return pathlib.Path(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_str(value: str | pathlib.Path) -> str:
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def toml_list(values: list[Any]) -> str:
    return "[" + ", ".join(toml_str(v) for v in values) + "]"


class Faults:
    """One server's control file (faults/rules.py): the test's rules and what the injector saw."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        path.write_text(json.dumps({"rules": []}))

    def set(self, *rules: dict[str, Any]) -> list[str]:
        """Installs rules (each gets a fresh id, so counts start at 0); returns the ids."""
        ids = []
        written = []
        for rule in rules:
            rule_id = f"{rule['tool']}-{rule.get('action', 'drop')}-{uuid.uuid4().hex[:8]}"
            written.append({**rule, "id": rule_id})
            ids.append(rule_id)
        self.path.write_text(json.dumps({"rules": written}))
        return ids

    def clear(self) -> None:
        self.path.write_text(json.dumps({"rules": []}))

    def events(self) -> list[dict[str, Any]]:
        log = pathlib.Path(str(self.path) + ".log")
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def calls(self, tool: str, key: str | None = None) -> list[dict[str, Any]]:
        """The `tools/call`s of `tool` the server was sent (with `_meta` and arguments), only
        those carrying idempotency key `key` when given."""
        out = []
        for event in self.events():
            if event["event"] != "forwarded" or event["tool"] != tool:
                continue
            meta = (event.get("meta") or {}).get("_meta") or {}
            if key is None or meta.get("dev.sluice/idempotency_key") == key:
                out.append(event)
        return out

    def fired(self, rule_id: str) -> list[str]:
        return [e["event"] for e in self.events() if e.get("rule") == rule_id]


@dataclass
class World:
    url: str
    bin: pathlib.Path
    root: pathlib.Path
    repo: pathlib.Path
    files: pathlib.Path
    memory_file: pathlib.Path
    git_faults: Faults
    fs_faults: Faults
    memory_faults: Faults
    repo_http: pathlib.Path
    git_http_faults: Faults
    log: pathlib.Path

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.repo), *args], check=True, capture_output=True, text=True
        ).stdout

    def graph(self) -> list[dict[str, Any]]:
        """The memory server's graph file, one JSON object a line."""
        if not self.memory_file.exists():
            return []
        return [json.loads(line) for line in self.memory_file.read_text().splitlines() if line.strip()]


def catalog(bin_dir: pathlib.Path, repo: pathlib.Path, files: pathlib.Path, memory_url: str,
            git_faults: Faults, fs_faults: Faults, git_http_url: str = "http://127.0.0.1:9/mcp") -> str:
    git_args = [str(WRAPPER), "--control", str(git_faults.path), "--env-digest", "GIT_SERVICE_TOKEN",
                "--env-digest", "SLUICE_GW_GIT_SECRET", "--",
                str(bin_dir / "mcp-server-git"),
                "--repository", str(repo)]
    fs_args = [str(WRAPPER), "--control", str(fs_faults.path), "--", str(bin_dir / "mcp-server-filesystem"),
               str(files)]
    # Short horizons, as the examples' tests use: a 5 s call, 0.4 s for a late commit, 0.5 s
    # between two absences, 1 s to the last look, 3 inconclusive lookups before STUCK.
    quick = ("max_attempts = 2, max_checks = 3, timeout_ms = 5000, late_commit_ms = 400, settle_ms = 500, "
             "verify_after_ms = 1000")
    return f"""
max_clock_skew_ms = 100

# A secret the git server gets in its environment (mcp-server-git needs none; the wrapper
# reports its digest, so the test sees it arrive and can look for it where it must not be).
[credentials.git_service]
kind = "bearer"
token = {{ env = "SLUICE_GW_GIT_SECRET" }}

# The bearer token every request to the memory server over HTTP carries (mcp-proxy asks for
# none; the fault proxy reports its digest).
[credentials.memory_api]
kind = "bearer"
token = {{ env = "SLUICE_GW_MEMORY_TOKEN" }}

# mcp-server-git (PyPI) over stdio, through the fault wrapper.
[mcp_servers.git]
command = {toml_str(sys.executable)}
args = {toml_list(git_args)}
env = {{ GIT_AUTHOR_NAME = "Sluice", GIT_AUTHOR_EMAIL = "sluice@example.com", GIT_COMMITTER_NAME = "Sluice", GIT_COMMITTER_EMAIL = "sluice@example.com" }}
env_credentials = {{ GIT_SERVICE_TOKEN = "git_service" }}
timeout_ms = 5000
allow = ["git_status", "git_add", "git_log", "git_commit", "git_create_branch", "git_branch"]

[mcp_servers.git.tools.git_commit]
set_arguments = {{ message = "{{args.message}}\\n\\nSluice-Key: {{idempotency_key}}" }}
policy = {{ {quick} }}

[mcp_servers.git.tools.git_commit.status_check]
tool = "git_log"
arguments = {{ repo_path = "{{args.repo_path}}", max_count = 50 }}
contains = "Sluice-Key: {{idempotency_key}}\\n"

# The branch is named by the key, whatever name the model gave.
[mcp_servers.git.tools.git_create_branch]
key_argument = "branch_name"
policy = {{ {quick} }}

[mcp_servers.git.tools.git_create_branch.status_check]
tool = "git_branch"
arguments = {{ repo_path = "{{args.repo_path}}", branch_type = "local" }}
contains = "{{idempotency_key}}"

# @modelcontextprotocol/server-filesystem (npm) over stdio, through the fault wrapper.
[mcp_servers.files]
command = {toml_str(sys.executable)}
args = {toml_list(fs_args)}
timeout_ms = 5000
allow = ["write_file", "edit_file", "read_text_file", "create_directory"]

[mcp_servers.files.tools.write_file]
policy = {{ {quick} }}

[mcp_servers.files.tools.write_file.status_check]
tool = "read_text_file"
arguments = {{ path = "{{args.path}}" }}
contains = "{{args.content}}"

# Undone by moving the file aside, through a tool the model is not given (move_file is not in
# allow): a compensation may call any tool the server lists.
[mcp_servers.files.tools.write_file.compensate]
tool = "move_file"
arguments = {{ source = "{{args.path}}", destination = "{{args.path}}.rolled-back" }}

# An author who will not take the server's word that an isError changed nothing: a failed edit
# is UNKNOWN, and with no lookup, a person's to settle.
[mcp_servers.files.tools.edit_file]
on_error = "unknown"
policy = {{ {quick} }}

# mcp-server-git again, over streamable HTTP (mcp-proxy) through the fault proxy, on a
# repository of its own: a lookup over HTTP after the connection is lost.
[mcp_servers.git_http]
url = {toml_str(git_http_url)}
timeout_ms = 5000
allow = ["git_log", "git_commit"]

[mcp_servers.git_http.tools.git_commit]
set_arguments = {{ message = "{{args.message}}\\n\\nSluice-Key: {{idempotency_key}}" }}
policy = {{ {quick} }}

[mcp_servers.git_http.tools.git_commit.status_check]
tool = "git_log"
arguments = {{ repo_path = "{{args.repo_path}}", max_count = 50 }}
contains = "Sluice-Key: {{idempotency_key}}\\n"

# @modelcontextprotocol/server-memory (npm) over streamable HTTP (mcp-proxy), through the fault
# proxy.
[mcp_servers.memory]
url = {toml_str(memory_url)}
credential = "memory_api"
timeout_ms = 5000
allow = ["create_entities", "create_relations", "add_observations", "open_nodes", "search_nodes"]

# The key goes into the first entity's observations (a JSON pointer; `-` appends), and the lookup
# opens that entity by name and looks for the key in it.
[mcp_servers.memory.tools.create_entities]
set_arguments = {{ "/entities/0/observations/-" = "Sluice-Key: {{idempotency_key}}" }}
policy = {{ {quick} }}

[mcp_servers.memory.tools.create_entities.status_check]
tool = "open_nodes"
arguments = {{ names = ["{{args.entities.0.name}}"] }}
contains = "Sluice-Key: {{idempotency_key}}"

# No place for a key, no lookup: a lost answer is a person's.
[mcp_servers.memory.tools.create_relations]
policy = {{ {quick} }}

# The server keeps an observation once whatever it is sent twice: a re-call is harmless, which
# the catalog (not the server's idempotentHint = false) says.
[mcp_servers.memory.tools.add_observations]
semantics = "IDEMPOTENT"
policy = {{ {quick} }}
"""


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: pathlib.Path) -> None:
    end = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"sluice dev exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"sluice dev did not come up at {url}: {log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def servers() -> pathlib.Path:
    return servers_bin()


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, servers: pathlib.Path) -> Iterator[World]:
    root = tmp_path_factory.mktemp("gateway")
    repo = root / "repo"
    files = root / "files"
    files.mkdir()
    memory_file = root / "memory.jsonl"
    repo_http = root / "repo-http"
    for path in (repo, repo_http):
        subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
        for key, value in (("user.name", "Test"), ("user.email", "test@example.com")):
            subprocess.run(["git", "-C", str(path), "config", key, value], check=True)
        (path / "README").write_text("a repository the gateway tests commit to\n")
        subprocess.run(["git", "-C", str(path), "add", "README"], check=True)
        subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "initial"], check=True)

    git_faults = Faults(root / "faults-git.json")
    fs_faults = Faults(root / "faults-files.json")
    memory_faults = Faults(root / "faults-memory.json")

    proxy = subprocess.Popen(
        [sys.executable, str(PROXY), "--control", str(memory_faults.path), "--header-digest", "Authorization", "--",
         str(servers / "mcp-proxy"), "--port", "{port}", "--log-level", "WARNING",
         "-e", "MEMORY_FILE_PATH", str(memory_file), "--", str(servers / "mcp-server-memory")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proxy.stdout is not None
    memory_url = proxy.stdout.readline().strip().rsplit(" ", 1)[-1] + "/mcp"
    git_http_faults = Faults(root / "faults-git-http.json")
    git_proxy = subprocess.Popen(
        [sys.executable, str(PROXY), "--control", str(git_http_faults.path), "--",
         str(servers / "mcp-proxy"), "--port", "{port}", "--log-level", "WARNING", "--",
         str(servers / "mcp-server-git"), "--repository", str(repo_http)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert git_proxy.stdout is not None
    git_http_url = git_proxy.stdout.readline().strip().rsplit(" ", 1)[-1] + "/mcp"

    (root / "catalog.toml").write_text(
        catalog(servers, repo, files, memory_url, git_faults, fs_faults, git_http_url))
    port = free_port()
    (root / "sluice.toml").write_text(f"""
[ledger]
data_dir = {toml_str(root / 'ledger')}
durability = "normal"
[catalog]
path = {toml_str(root / 'catalog.toml')}
[producer]
listen = "127.0.0.1:{port}"
[reconciler]
sweep_interval_ms = 200
[[auth.tokens]]
name = "gw-agent"
role = "agent"
token = "{AGENT_TOKEN}"
[[auth.tokens]]
name = "gw-admin"
role = "admin"
token = "{ADMIN_TOKEN}"
""")
    log = root / "sluice-dev.log"
    # The servers' programs on PATH too, as an operator's catalog would name them.
    env = {**os.environ, "RUST_BACKTRACE": "0", "PATH": f"{servers}:{os.environ.get('PATH', '')}",
           "SLUICE_GW_GIT_SECRET": GIT_SECRET, "SLUICE_GW_MEMORY_TOKEN": MEMORY_TOKEN}
    with log.open("wb") as sink:
        dev = subprocess.Popen(
            [SLUICE, "dev", "--config", str(root / "sluice.toml"), "--log-level", "info"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, dev, log)
        yield World(url=url, bin=servers, root=root, repo=repo, files=files, memory_file=memory_file,
                    git_faults=git_faults, fs_faults=fs_faults, memory_faults=memory_faults,
                    repo_http=repo_http, git_http_faults=git_http_faults, log=log)
    finally:
        for process in (dev, proxy, git_proxy):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def api(world: World, method: str, path: str, token: str = ADMIN_TOKEN, body: object | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{world.url}{path}", data=data, method=method,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=SETTLE_S + 15) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


TERMINAL = {"CONFIRMED", "FAILED", "CANCELLED", "COMPENSATED", "COMPENSATION_FAILED", "NO_COMPENSATION", "STUCK", "BLOCKED"}


def submit(world: World, run_id: str, tool: str, args: dict[str, Any], decision: int = 1,
           call_idx: int = 0) -> dict[str, Any]:
    """Submits an effect as an agent and waits until it settles (or needs a person)."""
    status, command = api(
        world, "POST", "/v1/effects", AGENT_TOKEN,
        {"run_id": run_id, "decision": decision, "tool": tool, "call_idx": call_idx, "args": args},
        headers={"prefer": "wait=30"},
    )
    assert status in (200, 201, 202), (status, command)
    return settle(world, command)


def settle(world: World, command: dict[str, Any]) -> dict[str, Any]:
    end = time.monotonic() + SETTLE_S
    while command.get("status") not in TERMINAL:
        if time.monotonic() > end:
            raise AssertionError(f"not settled in {SETTLE_S} s: {command}")
        key = urllib.parse.quote(command["command_key"], safe="")
        status, command = api(world, "GET", f"/v1/runs/{command['run_id']}/effects/{key}?wait=10s")
        assert status == 200, (status, command)
    return command


def new_run() -> str:
    return f"r-gw-{uuid.uuid4().hex[:10]}"

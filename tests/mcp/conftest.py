"""A real Sluice for the MCP tests: `sluice bench-upstream` (the demo bank, mail and tickets,
without faults), an upstream of the test's own (a stalling one for effects nobody can settle,
and a slow one that counts its calls, for clients that give up waiting), and `sluice dev` on
loopback with agent and admin tokens and a catalog pointing at both."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SLUICE = os.environ.get("SLUICE_BIN") or str(REPO / "target" / "debug" / "sluice")
AGENT_TOKEN = "mcp-agent-token-0123456789"
OTHER_AGENT_TOKEN = "mcp-other-agent-token-0123"
ADMIN_TOKEN = "mcp-admin-token-0123456789"

# A NON_IDEMPOTENT tool whose call hangs past its timeout and whose status check never answers
# usefully: its outcome cannot be known, so it ends STUCK for a person.
STALL_TOOL = """
[[tool]]
name = "lab/stall"
description = "Book a slot with a supplier whose API hangs and cannot be asked"
semantics = "NON_IDEMPOTENT"
business_key = "{slot}"
schema = { type = "object", additionalProperties = false, required = ["slot"], properties = { slot = { type = "string", minLength = 1, maxLength = 32 } } }

[tool.policy]
max_attempts = 1
timeout_ms = 300
max_checks = 1
settle_ms = 0
lease_ttl_ms = 2000
late_commit_ms = 300
verify_after_ms = 1000

[tool.dispatch]
url = "{stall}/book"

[tool.status_check]
url = "{stall}/slots/{business_key}"
absent_status = [404]
duplicate_status = [409]

[[tool]]
name = "lab/slow"
description = "Reserve a room with a supplier that takes a while to answer"
semantics = "IDEMPOTENT"
schema = { type = "object", additionalProperties = false, required = ["room"], properties = { room = { type = "string", minLength = 1, maxLength = 32 } } }

[tool.policy]
max_attempts = 1
timeout_ms = 10000

[tool.dispatch]
url = "{stall}/slow"
reference_pointer = "/id"
"""

# What the slow upstream was asked, per room: how many calls reached it, and the W3C
# `traceparent` each carried.
SLOW_CALLS: dict[str, int] = {}
SLOW_TRACES: dict[str, list[str]] = {}
SLOW_S = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Stall(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/slow":
            room = json.loads(self.rfile.read(int(self.headers["content-length"])))["room"]
            SLOW_CALLS[room] = SLOW_CALLS.get(room, 0) + 1
            SLOW_TRACES.setdefault(room, []).append(self.headers.get("traceparent", ""))
            time.sleep(SLOW_S)
            body = json.dumps({"id": f"room-{room}-{SLOW_CALLS[room]}"}).encode()
            self.send_response(201)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        time.sleep(2)
        self.send_response(201)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(503)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@dataclass
class Sluice:
    url: str
    upstream: str
    catalog: pathlib.Path | None = None


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: pathlib.Path) -> None:
    end = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"sluice dev exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"sluice dev did not come up at {url}")
        time.sleep(0.1)


def first_line(process: subprocess.Popen[str], marker: str) -> str:
    """Reads the child's stdout until the line that holds `marker`."""
    assert process.stdout is not None
    for line in process.stdout:
        if marker in line:
            return line.strip()
    raise RuntimeError(f"the process ended before printing {marker!r}")


@pytest.fixture(scope="session")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sluice]:
    root = tmp_path_factory.mktemp("sluice")
    stall = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stall)
    threading.Thread(target=stall.serve_forever, daemon=True).start()
    stall_url = f"http://127.0.0.1:{stall.server_address[1]}"

    upstream = subprocess.Popen(
        [SLUICE, "bench-upstream", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    upstream_url = first_line(upstream, "listening on").rsplit(" ", 1)[-1].rstrip("/")

    catalog = (REPO / "deploy" / "catalog.toml").read_text()
    catalog = catalog.replace("http://127.0.0.1:8787", upstream_url)
    catalog += STALL_TOOL.replace("{stall}", stall_url)
    (root / "catalog.toml").write_text(catalog)
    try:
        with dev_server(root, root / "catalog.toml") as url:
            yield Sluice(url=url, upstream=upstream_url, catalog=root / "catalog.toml")
    finally:
        upstream.terminate()
        try:
            upstream.wait(timeout=20)
        except subprocess.TimeoutExpired:
            upstream.kill()
        stall.shutdown()


@contextlib.contextmanager
def dev_server(root: pathlib.Path, catalog: pathlib.Path,
               env: dict[str, str] | None = None) -> Iterator[str]:
    """`sluice dev` with its ledger under `root`, the tests' tokens and `catalog`, with `env`
    added to its environment: its URL."""
    port = free_port()
    config = f"""
[ledger]
data_dir = "{root / 'ledger'}"
durability = "normal"
[catalog]
path = "{catalog}"
[producer]
listen = "127.0.0.1:{port}"
[reconciler]
sweep_interval_ms = 200
[[auth.tokens]]
name = "mcp-agent"
role = "agent"
token = "{AGENT_TOKEN}"
[[auth.tokens]]
name = "other-agent"
role = "agent"
token = "{OTHER_AGENT_TOKEN}"
[[auth.tokens]]
name = "mcp-admin"
role = "admin"
token = "{ADMIN_TOKEN}"
"""
    (root / "sluice.toml").write_text(config)
    log = root / "sluice-dev.log"
    with log.open("wb") as sink:
        dev = subprocess.Popen(
            [SLUICE, "dev", "--config", str(root / "sluice.toml"), "--log-level", "warn"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_BACKTRACE": "0", **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, dev, log)
        yield url
    finally:
        dev.terminate()
        try:
            dev.wait(timeout=20)
        except subprocess.TimeoutExpired:
            dev.kill()


def api(sluice: Sluice, method: str, path: str, token: str, body: object | None = None) -> dict:
    """Calls Sluice's HTTP API directly: what the tests check the MCP answers against."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{sluice.url}{path}",
        data=data,
        method=method,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())

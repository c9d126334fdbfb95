"""Fixtures: one `sluice dev` per session whose catalog is the test toolbox's own
`catalog_toml()`, the toolbox served by uvicorn, and clients with the agent's token."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sluice

import toolbox
from servers import AppServer, SluiceDev, sluice_bin


@pytest.fixture(scope="session")
def tools_server() -> Iterator[AppServer]:
    with AppServer(toolbox.app) as server:
        yield server


@pytest.fixture(scope="session")
def server(
    tools_server: AppServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceDev]:
    workdir = tmp_path_factory.mktemp("sluice")
    with SluiceDev(workdir, toolbox.catalog(tools_server.url)) as dev:
        yield dev


@pytest.fixture
def client(server: SluiceDev) -> Iterator[sluice.Client]:
    with sluice.Client(server.url, server.agent_token, wait=30) as agent:
        yield agent


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:60]}-{uuid.uuid4().hex[:8]}".replace("[", ".").replace("]", "")


@pytest.fixture
def world() -> toolbox.World:
    return toolbox.world


@pytest.fixture(scope="session")
def repo() -> Path:
    from servers import REPO

    return REPO


@pytest.fixture
def demo_upstream() -> Iterator[str]:
    """The demo upstream without faults (`sluice bench-upstream`, from the same binary)."""
    process = subprocess.Popen(
        [sluice_bin(), "bench-upstream", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = re.search(r"http://\S+", line)
        assert url, f"the demo upstream did not say where it listens: {line!r}"
        yield url.group(0)
    finally:
        process.terminate()
        process.wait(timeout=10)

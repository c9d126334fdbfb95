"""Fixtures: one `sluice dev` per session whose catalog is the test toolbox's own
`catalog_toml()`, the toolbox served by uvicorn, and clients with the agent's token."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sluice

import toolbox
from servers import AppServer, SluiceDev


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

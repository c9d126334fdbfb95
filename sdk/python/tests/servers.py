"""Real servers for the tests: `sluice dev` as a child process, and ASGI apps under uvicorn in a
thread, each on a free loopback port. Nothing is mocked."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from sluice.tool import ENV_VAR

from signed import KEY

REPO = Path(__file__).resolve().parents[3]


def sluice_bin() -> str:
    """`$SLUICE_BIN`, else the first debug build found. Asked for only by the tests that run
    `sluice`, so the others run without one."""
    if os.environ.get("SLUICE_BIN"):
        return os.environ["SLUICE_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for candidate in (Path("/work/bin/sluice"), target / "debug" / "sluice"):
        if candidate.exists():
            return str(candidate)
    raise RuntimeError("no sluice binary: set SLUICE_BIN (cargo build -p sluice builds one)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class AppServer:
    """An ASGI app served by uvicorn on a loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> AppServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class SluiceDev:
    """`sluice dev` on a fresh SQLite ledger with the given catalog, an agent and an admin token,
    signing its calls to tool services with `signing_keys` (default: the tests' key), given in
    SLUICE_TOOL_SIGNING_KEYS as the printed catalogs' credential reads them."""

    def __init__(
        self, workdir: Path, catalog: str | None, signing_keys: list[str] | None = None
    ) -> None:
        self.workdir = workdir
        self.signing_keys = [KEY] if signing_keys is None else signing_keys
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_token = "agent-" + secrets.token_hex(16)
        self.admin_token = "admin-" + secrets.token_hex(16)
        workdir.mkdir(parents=True, exist_ok=True)
        catalog_line = ""
        if catalog is not None:
            (workdir / "catalog.toml").write_text(catalog)
            catalog_line = f'[catalog]\npath = "{workdir / "catalog.toml"}"\n'
        self.config = workdir / "sluice.toml"
        self.config.write_text(
            f'[ledger]\ndata_dir = "{workdir / "ledger"}"\ndurability = "normal"\n'
            f"{catalog_line}"
            f'[producer]\nlisten = "127.0.0.1:{self.port}"\n'
            "[reconciler]\nsweep_interval_ms = 100\n"
            '[telemetry]\nlog_level = "warn"\n'
            f'[[auth.tokens]]\nname = "test-agent"\nrole = "agent"\ntoken = "{self.agent_token}"\n'
            # Tenants the agent may name: acme, and "closed", whose quota refuses every effect.
            'tenants = ["acme", "closed"]\n'
            f'[[auth.tokens]]\nname = "test-admin"\nrole = "admin"\ntoken = "{self.admin_token}"\n'
            "[tenants]\nretry_after_ms = 2000\n[tenants.quotas]\nclosed = 0\n"
        )
        self.log = workdir / "sluice.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SluiceDev:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sluice_bin(), "dev", "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, ENV_VAR: " ".join(self.signing_keys)},
            )
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"sluice dev exited:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sluice dev not ready:\n{self.log.read_text()}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def console(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `sluice` operator console as an admin, as a person would run it."""
        env = {**os.environ, "SLUICE_URL": self.url, "SLUICE_TOKEN": self.admin_token}
        return subprocess.run(
            [sluice_bin(), *args], env=env, capture_output=True, text=True, timeout=60
        )

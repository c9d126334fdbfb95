"""One demo upstream and one `sluice dev`, started as the README starts them (`sluice upstream`,
`sluice dev`, no configuration), for every example of the README in turn. Only the addresses
differ: both listen on a free loopback port, the example catalog's `${upstream}` is pointed at
the upstream with SLUICE_UPSTREAM_URL, and the URL and token are the ones `sluice dev` prints."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLUICE = os.environ.get("SLUICE_BIN") or str(
    Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "sluice"
)


@dataclass
class Servers:
    upstream: str  # http://127.0.0.1:<port>
    url: str  # SLUICE_URL as `sluice dev` prints it
    token: str  # SLUICE_TOKEN as `sluice dev` prints it
    log: Path


def clean_env() -> dict[str, str]:
    """The caller's environment without Sluice's own variables, so that nothing but what the
    README says reaches the servers and the examples."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}


def _wait_for(path: Path, pattern: str, process: subprocess.Popen[bytes], what: str) -> re.Match[str]:
    deadline = time.monotonic() + 60
    while True:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start ({process.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("readme")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        # `cargo run --release -p sluice -- upstream`, on a port of its own.
        up_out = root / "upstream.out"
        with up_out.open("wb") as out:
            processes.append(subprocess.Popen(
                [SLUICE, "upstream", "--listen", "127.0.0.1:0"],
                stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=root,
            ))
        upstream = _wait_for(up_out, r"listening on (http://\S+)", processes[0], "sluice upstream").group(1)

        # `cargo run --release -p sluice -- dev`, in a directory of its own (its ledger and token
        # in ./.sluice/ there), on a free port, calling the upstream above.
        dev_dir = root / "dev"
        dev_dir.mkdir()
        dev_out = root / "dev.out"
        env = {**clean_env(), "SLUICE_UPSTREAM_URL": upstream, "SLUICE_PRODUCER__LISTEN": "127.0.0.1:0"}
        with dev_out.open("wb") as out:
            processes.append(subprocess.Popen(
                [SLUICE, "dev"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=dev_dir,
            ))
        line = _wait_for(
            dev_out, r"export SLUICE_URL=(\S+) SLUICE_TOKEN=(\S+)", processes[1], "sluice dev"
        )
        yield Servers(upstream=upstream.rstrip("/"), url=line.group(1), token=line.group(2), log=dev_out)
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

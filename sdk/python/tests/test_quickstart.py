"""The README's quickstart, extracted from sdk/python/README.md and run exactly as written
against `sluice dev` on the example catalog and the demo upstream."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from servers import REPO, SluiceDev

README = Path(__file__).resolve().parents[1] / "README.md"
# The repository's README shows the same block; both are held to running as written.
ROOT_README = Path(__file__).resolve().parents[3] / "README.md"
MARKED = r"<!-- quickstart:python -->\n(.*?)<!-- /quickstart:python -->"


def quickstart() -> str:
    block = re.search(MARKED, README.read_text(), re.S)
    assert block, "README.md has no quickstart:python block"
    shown = re.search(MARKED, ROOT_README.read_text(), re.S)
    assert shown and shown.group(1) == block.group(1), (
        "the repository README shows the same quickstart"
    )
    assert len(block.group(1).splitlines()) <= 15, "the quickstart must stay within 15 lines"
    code = re.fullmatch(r"```python\n(.*)```\n", block.group(1), re.S)
    assert code, "the quickstart block is one ```python fence"
    return code.group(1)


def test_the_quickstart_runs_as_written(demo_upstream: str, tmp_path: Path) -> None:
    # The example catalog, pointed at this test's upstream instead of 127.0.0.1:8787.
    catalog = (REPO / "deploy" / "catalog.toml").read_text()
    catalog = catalog.replace("http://127.0.0.1:8787", demo_upstream)
    with SluiceDev(tmp_path, catalog) as dev:
        env = {**os.environ, "SLUICE_URL": dev.url, "SLUICE_TOKEN": dev.admin_token}
        runs = [
            subprocess.run(
                [sys.executable, "-c", quickstart()],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            for _ in range(2)
        ]
    for ran in runs:
        assert ran.returncode == 0, ran.stderr
    assert runs[0].stdout == runs[1].stdout
    assert re.fullmatch(r"w-\d+ m-\d+\n", runs[0].stdout), runs[0].stdout
    stats = httpx.get(f"{demo_upstream}/_stats").json()
    assert (stats["wires"], stats["emails"]) == (1, 1)

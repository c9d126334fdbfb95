"""The Python agent-framework examples (examples/agents/openai-agents-python, .../langgraph) run
as a user runs them, on their frameworks' test models: against `sluice dev` with the example
catalog and the demo upstream, twice with one run id (one wire, one email), and once with a
wire Sluice holds for approval, which a person approves with the printed console line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_people import console_line

from servers import REPO, SluiceDev

EXAMPLES = REPO / "examples" / "agents"
FINAL = "final: Paid invoice 42 and told accounts payable.\n"


@pytest.mark.parametrize("example", ["openai-agents-python", "langgraph"])
def test_the_example_runs_on_the_test_model_and_waits_for_sluices_approval(
    example: str,
    demo_upstream: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("agents" if example.startswith("openai") else "langgraph")
    script = EXAMPLES / example / "agent.py"
    catalog = (REPO / "deploy" / "catalog.toml").read_text()
    catalog = catalog.replace("http://127.0.0.1:8787", demo_upstream)
    stats = f"{demo_upstream}/_stats"
    with SluiceDev(tmp_path, catalog) as dev:
        env = {**os.environ, "SLUICE_URL": dev.url, "SLUICE_TOKEN": dev.admin_token}
        env.pop("OPENAI_API_KEY", None)  # the framework's test model, never a real one
        runs = [
            subprocess.run(
                [sys.executable, str(script)],
                env={**env, "RUN_ID": f"{example}-1"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            for _ in range(2)
        ]
        for ran in runs:
            assert ran.returncode == 0, ran.stderr
        assert runs[0].stdout == runs[1].stdout
        assert runs[0].stdout.endswith(FINAL), runs[0].stdout
        assert runs[0].stdout.count("tool output: ") == 2, runs[0].stdout
        assert '"beneficiary": "supplier-7"' in runs[0].stdout
        assert httpx.get(stats).json()["wires"] == 1
        assert httpx.get(stats).json()["emails"] == 1

        # Above approve_above: the agent stops at its framework's approval and waits for Sluice's.
        waiting = subprocess.Popen(
            [sys.executable, str(script)],
            env={
                **env,
                "RUN_ID": f"{example}-2",
                "AMOUNT_MINOR": "2500000",
                "APPROVAL_TIMEOUT_S": "60",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert waiting.stdout is not None
            line = waiting.stdout.readline()
            assert line.startswith("waiting for a person's approval of d-1/payments/wire/0: "), line
            assert httpx.get(stats).json()["wires"] == 1  # nothing ran
            approved = dev.console(*console_line(line, "sluice approve"))
            assert approved.returncode == 0, approved.stderr
            out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        assert waiting.returncode == 0, err
        assert out.endswith(FINAL), out
        assert '"amount_minor": 2500000' in out
    assert httpx.get(stats).json()["wires"] == 2
    assert httpx.get(stats).json()["emails"] == 2

"""The caller's trace, end to end through a real OpenTelemetry Collector: a 2026-07-28 client
puts `traceparent` in a call's `_meta`, `sluice mcp` sends it to the API, and the spans a
`sluice dev` exporting over OTLP writes are in the caller's trace — the API's server span the
child of the caller's span, the tool call's span beside it. The collector is the one
`scripts/otelcol/install.sh` builds (`SLUICE_OTELCOL_BIN`, else the cache's), as for
tests/tests/traces.rs; without one this test says it is skipped (scripts/test.sh builds it)."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import AGENT_TOKEN, Sluice, dev_server, free_port
from test_mcp import EMAIL, facts, http_server
from test_modern import at, modern, new_run

pytestmark = pytest.mark.anyio

OTELCOL = pathlib.Path(os.environ.get("SLUICE_OTELCOL_BIN") or
                       pathlib.Path.home() / ".cache/sluice/otelcol/v0.161.0/sluice-otelcol")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def collector(tmp_path: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """A collector with an OTLP/HTTP receiver and the file exporter: its endpoint and output."""
    if not OTELCOL.exists():
        pytest.skip(f"no OpenTelemetry Collector at {OTELCOL} (scripts/otelcol/install.sh "
                    "builds one; scripts/test.sh runs it)")
    port = free_port()
    output = tmp_path / "traces.jsonl"
    config = tmp_path / "otelcol.yaml"
    config.write_text(
        f"receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n"
        f"exporters:\n  file:\n    path: {output}\n    format: json\n    flush_interval: 100ms\n"
        "service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n"
        "      receivers: [otlp]\n      exporters: [file]\n")
    log = (tmp_path / "otelcol.log").open("wb")
    process = subprocess.Popen([str(OTELCOL), "--config", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < end, (
                    (tmp_path / "otelcol.log").read_text())
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", output
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def spans_of(output: pathlib.Path, trace_id: str) -> list[dict[str, Any]]:
    found = []
    text = output.read_text() if output.exists() else ""
    for line in filter(str.strip, text.splitlines()):
        for resource in json.loads(line).get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                found += [s for s in scope.get("spans", []) if s.get("traceId") == trace_id]
    return found


async def test_the_caller_s_span_is_the_parent_of_sluice_s(
        sluice: Sluice, collector: tuple[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    endpoint, output = collector
    trace_id, caller_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    run_id = new_run()
    assert sluice.catalog is not None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    with dev_server(tmp_path, sluice.catalog, env) as url:
        with http_server(Sluice(url=url, upstream=sluice.upstream)) as mcp_url:
            async with modern(mcp_url, AGENT_TOKEN) as client:
                meta = {**at(run_id, call=0), "traceparent": f"00-{trace_id}-{caller_span}-01"}
                result = await client.call_tool("email__send", EMAIL, meta=meta)
    # `sluice dev` has exited, flushing its exporter; the collector writes every 100 ms.
    assert facts(result)["status"] == "CONFIRMED", result
    end = time.monotonic() + 15
    while True:
        spans = spans_of(output, trace_id)
        children = [s for s in spans if s.get("parentSpanId") == caller_span]
        if children and any(s["name"] == "execute_tool email/send" for s in spans):
            break
        assert time.monotonic() < end, [(s["name"], s.get("parentSpanId")) for s in spans]
        time.sleep(0.2)
    assert any(s["name"].startswith("POST") for s in children), [s["name"] for s in children]

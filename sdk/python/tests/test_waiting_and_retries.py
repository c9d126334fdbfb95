"""Waiting past the client's patience, and a server that answers 503 before it accepts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import sluice

from servers import AppServer, SluiceDev
from toolbox import World


def test_an_effect_slower_than_the_wait_times_out_and_is_picked_up_again(
    client: sluice.Client, run_id: str, world: World
) -> None:
    before = world.calls["shop/slow"]
    with client.run(run_id) as run:
        with pytest.raises(sluice.EffectTimeout) as late:
            run.call("shop/slow", {"seconds": 1.5}, wait=0.3)
        assert late.value.command_key == "d-1/shop/slow/0"
        assert not late.value.effect.settled
        assert "run.wait('d-1/shop/slow/0')" in late.value.remedy
        done = run.wait(late.value.command_key, timeout=20)
    assert done.status == "CONFIRMED" and done.result["slept"] == 1.5
    with client.run(run_id) as again:
        assert again.call("shop/slow", {"seconds": 1.5}).result == done.result
    assert world.calls["shop/slow"] == before + 1


class Backlog:
    """A real reverse proxy in front of `sluice dev` that answers the first `busy` submissions
    503 with Retry-After, as a producer whose dispatch backlog is full does."""

    def __init__(self, upstream: str, busy: int) -> None:
        self.upstream = upstream
        self.busy = busy
        self.refused = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/v1/effects" and self.refused < self.busy:
            self.refused += 1
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"0")],
                }
            )
            error = b'{"error":{"code":"dispatch_backlog_full","message":"submit again later"}}'
            await send({"type": "http.response.body", "body": error})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k != b"host"}
        async with httpx.AsyncClient() as forward:
            answer = await forward.request(
                scope["method"],
                self.upstream + scope["path"],
                content=body,
                headers=headers,
                params=scope["query_string"].decode(),
                timeout=90,
            )
        await send(
            {
                "type": "http.response.start",
                "status": answer.status_code,
                "headers": [
                    (k.encode(), v.encode())
                    for k, v in answer.headers.items()
                    if k not in ("content-length", "transfer-encoding")
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer.content})


@pytest.fixture
def backlog(server: SluiceDev) -> Iterator[tuple[Backlog, str]]:
    proxy = Backlog(server.url, busy=0)
    with AppServer(proxy) as served:
        yield proxy, served.url


def test_a_503_is_retried_until_the_server_accepts(
    server: SluiceDev, backlog: tuple[Backlog, str], run_id: str
) -> None:
    proxy, url = backlog
    proxy.busy = 3
    with sluice.Client(url, server.agent_token) as client, client.run(run_id) as run:
        effect = run.call("shop/notify", {"to": "a@example.com", "text": "eventually"})
    assert proxy.refused == 3 and effect.status == "CONFIRMED"


def test_a_server_that_stays_unavailable_is_reported(
    server: SluiceDev, backlog: tuple[Backlog, str], run_id: str
) -> None:
    proxy, url = backlog
    proxy.busy = 100
    retries = sluice.Retries(max_retries=2, base_delay=0.01)
    with (
        sluice.Client(url, server.agent_token, retries=retries) as client,
        client.run(run_id) as run,
        pytest.raises(sluice.Unavailable) as unavailable,
    ):
        run.call("shop/notify", {"to": "a@example.com", "text": "never"})
    assert proxy.refused == 3
    assert unavailable.value.code == "dispatch_backlog_full"
    assert (unavailable.value.run_id, unavailable.value.command_key) == (
        run_id,
        "d-1/shop/notify/0",
    )

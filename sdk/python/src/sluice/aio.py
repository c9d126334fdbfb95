"""The asyncio client: :class:`AsyncClient` and :class:`AsyncRun`, the same operations as
:mod:`sluice.client` (same journal, errors and waits), awaited.

Decorated ``async def`` effects belong to an ``async with client.run(...)`` block. Calls made
concurrently (``asyncio.gather``) take their journal positions when their intents are ready, so
they get the same keys on every run as long as the intents are computed without awaiting IO.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _protocol as proto
from ._base import DEFAULT_WAIT, ClientConfig, RunCore, schedule, tools_conversation
from ._context import current_run
from .catalog import Catalog, ToolDescription
from .client import Client
from .effects import Declaration
from .models import ApprovalLink, Effect, RollbackProgress

T = TypeVar("T")


class AsyncClient:
    """An asyncio Sluice client; see :class:`sluice.Client` for the arguments."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        wait: float = DEFAULT_WAIT,
        retries: proto.Retries | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._config = ClientConfig(url, token, wait, retries or proto.Retries())
        self._http = http or httpx.AsyncClient()
        self._owns_http = http is None
        self._catalog_lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return self._config.url

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def drive(self, conversation: proto.Conversation[T]) -> T:
        """Carries out a conversation of ``_protocol`` over HTTP."""
        reply: proto.Reply = None
        while True:
            try:
                step = conversation.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, proto.Sleep):
                await asyncio.sleep(step.seconds)
                reply = None
                continue
            try:
                response = await self._http.request(
                    step.method,
                    self._config.url + step.path,
                    params=step.params,
                    json=step.json,
                    headers={**self._config.headers, **step.headers},
                    timeout=step.timeout,
                )
            except httpx.TransportError as lost:
                reply = proto.NoAnswer(f"{type(lost).__name__}: {lost}")
                continue
            reply = proto.Answer(response.status_code, response.headers, _json(response))

    async def tools(self, *, refresh: bool = False) -> Catalog:
        """The server's catalog (``GET /v1/tools``), fetched once and cached."""
        async with self._catalog_lock:
            if self._config.catalog is None or refresh:
                self._config.catalog = await self.drive(tools_conversation(self._config.retries))
        return self._config.catalog

    def check(self, declaration: Declaration) -> ToolDescription:
        """Checks a decorated tool against the catalog at decoration time.

        Decoration happens outside the event loop (at import), so the catalog is fetched once
        with a blocking request here when it is not cached yet.
        """
        if self._config.catalog is None:
            with Client(self.url, self._config.token, retries=self._config.retries) as blocking:
                self._config.catalog = blocking.tools()
        return self._config.check(self._config.catalog, declaration)

    async def acheck(self, declaration: Declaration) -> ToolDescription:
        """Checks a decorated tool against the catalog, fetching it without blocking."""
        return self._config.check(await self.tools(), declaration)

    async def whoami(self) -> dict[str, Any]:
        body: dict[str, Any] = await self.drive(
            proto.call("GET", "/v1/whoami", self._config.retries)
        )
        return body

    def run(self, run_id: str | None = None, *, tenant: str | None = None) -> AsyncRun:
        """A run (``async with client.run(...) as run:`` makes it current for decorated effects);
        ``tenant`` as for :meth:`sluice.Client.run`."""
        return AsyncRun(self, run_id, tenant=tenant)


class AsyncRun:
    """One agent run of an :class:`AsyncClient`; see :class:`sluice.Run`."""

    def __init__(
        self, client: AsyncClient, run_id: str | None = None, *, tenant: str | None = None
    ) -> None:
        self.client = client
        self._core = RunCore(client._config, run_id, tenant)
        self._tokens: list[Any] = []

    @property
    def run_id(self) -> str:
        return self._core.run_id

    @property
    def decision(self) -> int:
        return self._core.decision

    def __repr__(self) -> str:
        return f"AsyncRun({self.run_id!r}, decision={self.decision})"

    async def __aenter__(self) -> AsyncRun:
        # Loaded first, so concurrent calls of bare tool names take positions without awaiting.
        await self.client.tools()
        self._tokens.append(current_run.set(self))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        current_run.reset(self._tokens.pop())

    def decide(self) -> int:
        """Opens the next decision: every tool's call index starts again at 0."""
        return self._core.decide()

    async def _position(self, tool: str) -> Any:
        catalog = (
            None if "/" in tool else (self.client._config.catalog or await self.client.tools())
        )
        return self._core.position(catalog, tool)

    async def invoke(self, declaration: Declaration, args: Mapping[str, Any]) -> Effect:
        """Records a decorated function's intent and returns the CONFIRMED effect."""
        if not self.client._config.is_checked(declaration):
            await self.client.acheck(declaration)
        return await self.call(declaration.tool, args, wait=declaration.wait)

    async def call(
        self, tool: str, args: Mapping[str, Any], *, wait: float | None = None
    ) -> Effect:
        """See :meth:`sluice.Run.call`."""
        key = await self._position(tool)
        return proto.outcome(await self.client.drive(self._core.submit(key, args, wait)))

    async def schedule_effect(
        self,
        tool: str,
        args: Mapping[str, Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> Effect:
        """See :meth:`sluice.Run.schedule_effect`."""
        when = schedule(delay, at)
        key = await self._position(tool)
        return await self.client.drive(self._core.submit(key, args, 0, **when))

    async def get_scheduled_effects(self, tool: str | None = None) -> list[Effect]:
        return await self.client.drive(self._core.listing("/scheduled", tool=tool))

    async def remove_scheduled_effect(
        self, command_key: str | Effect, reason: str | None = None
    ) -> Effect:
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return await self.client.drive(self._core.remove(key, reason))

    async def effects(self, *, status: str | None = None, tool: str | None = None) -> list[Effect]:
        return await self.client.drive(self._core.listing("/effects", status=status, tool=tool))

    async def get(self, command_key: str) -> Effect:
        return await self.client.drive(self._core.get(command_key))

    async def wait(self, command_key: str | Effect, timeout: float | None = None) -> Effect:
        """See :meth:`sluice.Run.wait`."""
        effect = command_key if isinstance(command_key, Effect) else await self.get(command_key)
        deadline = time.monotonic() + (self.client._config.wait if timeout is None else timeout)
        conversation = proto.poll(
            effect, deadline=deadline, retries=self.client._config.retries, through_people=True
        )
        return proto.outcome(await self.client.drive(conversation))

    async def approve(
        self,
        command_key: str | Effect,
        reason: str,
        *,
        args: Mapping[str, Any] | None = None,
    ) -> Effect:
        """See :meth:`sluice.Run.approve`."""
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return await self.client.drive(self._core.approve(key, reason, args))

    async def approval_link(
        self,
        command_key: str | Effect,
        *,
        expires_in: int | None = None,
        recipient: str | None = None,
    ) -> ApprovalLink:
        """See :meth:`sluice.Run.approval_link`."""
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return await self.client.drive(self._core.approval_link(key, expires_in, recipient))

    async def rollback(self, reason: str) -> RollbackProgress:
        """See :meth:`sluice.Run.rollback`."""
        return await self.client.drive(self._core.rollback(reason))

    async def rollback_progress(self) -> RollbackProgress:
        return await self.client.drive(self._core.rollback_progress())

    async def wait_rolled_back(
        self, timeout: float = 60.0, interval: float = 0.2
    ) -> RollbackProgress:
        deadline = time.monotonic() + timeout
        while True:
            progress = await self.rollback_progress()
            if progress.done:
                return progress
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rollback of {self.run_id} not done after {timeout} s: {progress}"
                )
            await asyncio.sleep(interval)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text

"""The synchronous client: :class:`Client` talks to a Sluice server, :class:`Run` walks one
agent run's journal.

Every effect is recorded in the ledger before it runs, under an idempotency key derived from
its journal position (``<run_id>/d-<decision>/<tool>/<call_idx>``). Re-driving an agent from the
start with the same run id walks the same positions, so it produces the same keys and gets the
stored results back instead of new effects.
"""

from __future__ import annotations

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
from .effects import Declaration
from .models import ApprovalLink, Effect, RollbackProgress

T = TypeVar("T")


class Client:
    """A synchronous Sluice client (thread-safe; one per process is enough).

    ``url`` and ``token`` default to ``SLUICE_URL`` and ``SLUICE_TOKEN``, as ``sluice dev``
    prints them. ``wait`` is how many seconds a call waits for its effect to settle before
    raising :class:`~sluice.errors.EffectTimeout` (the effect goes on). A 503 or a lost answer
    is retried with backoff (``Retry-After`` when the server gives one).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        wait: float = DEFAULT_WAIT,
        retries: proto.Retries | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self._config = ClientConfig(url, token, wait, retries or proto.Retries())
        self._http = http or httpx.Client()
        self._owns_http = http is None

    @property
    def url(self) -> str:
        return self._config.url

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def drive(self, conversation: proto.Conversation[T]) -> T:
        """Carries out a conversation of ``_protocol`` over HTTP."""
        reply: proto.Reply = None
        while True:
            try:
                step = conversation.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, proto.Sleep):
                time.sleep(step.seconds)
                reply = None
                continue
            try:
                response = self._http.request(
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

    def tools(self, *, refresh: bool = False) -> Catalog:
        """The server's catalog (``GET /v1/tools``), fetched once and cached."""
        if self._config.catalog is None or refresh:
            self._config.catalog = self.drive(tools_conversation(self._config.retries))
        return self._config.catalog

    def check(self, declaration: Declaration) -> ToolDescription:
        """Checks a decorated tool against the catalog; raises DeclarationError on a mismatch."""
        return self._config.check(self.tools(), declaration)

    def whoami(self) -> dict[str, Any]:
        """The caller as the server sees its token: name, role, authenticated."""
        body: dict[str, Any] = self.drive(proto.call("GET", "/v1/whoami", self._config.retries))
        return body

    def run(self, run_id: str | None = None, *, tenant: str | None = None) -> Run:
        """A run (``with client.run(...) as run:`` makes it current for decorated effects).

        Give the same ``run_id`` to re-drive an agent: a fresh id (``r-<uuid>``) is made when none.
        ``tenant`` records the run's effects under a tenant the token may name (a platform acting
        for one of its customers); by default they are the token's own. A tenant over its quota
        of effects in flight is refused with :class:`~sluice.errors.OverQuota`.
        """
        return Run(self, run_id, tenant=tenant)


class Run:
    """One agent run: its id and journal position, and what an agent may do in it.

    Not meant to be shared by threads making calls at once: the journal position is what makes
    keys stable, and only a deterministic order of calls keeps it so.
    """

    def __init__(
        self, client: Client, run_id: str | None = None, *, tenant: str | None = None
    ) -> None:
        self.client = client
        self._core = RunCore(client._config, run_id, tenant)
        self._tokens: list[Any] = []

    @property
    def run_id(self) -> str:
        return self._core.run_id

    @property
    def tenant(self) -> str | None:
        """The tenant named for this run's effects (``None``: the token's own)."""
        return self._core.tenant

    @property
    def decision(self) -> int:
        """The decision the next call belongs to (the journal starts in decision 1)."""
        return self._core.decision

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, decision={self.decision})"

    def __enter__(self) -> Run:
        self._tokens.append(current_run.set(self))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        current_run.reset(self._tokens.pop())

    def decide(self) -> int:
        """Opens the next decision: every tool's call index starts again at 0."""
        return self._core.decide()

    def _catalog_for(self, tool: str) -> Catalog | None:
        return None if "/" in tool else self.client.tools()

    def invoke(self, declaration: Declaration, args: Mapping[str, Any]) -> Effect:
        """Records a decorated function's intent and returns the CONFIRMED effect."""
        self.client.check(declaration)
        return self.call(declaration.tool, args, wait=declaration.wait)

    def call(self, tool: str, args: Mapping[str, Any], *, wait: float | None = None) -> Effect:
        """Records an effect of ``tool`` at the next journal position, waits for it to settle and
        returns it CONFIRMED (``.result`` is the upstream's answer); raises the
        :class:`~sluice.errors.EffectError` of any other status, or the
        :class:`~sluice.errors.ApiError` of a refusal (e.g. :class:`~sluice.errors.ArgumentDrift`).
        """
        key = self._core.position(self._catalog_for(tool), tool)
        return proto.outcome(self.client.drive(self._core.submit(key, args, wait)))

    def schedule_effect(
        self,
        tool: str,
        args: Mapping[str, Any],
        *,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> Effect:
        """Records an effect to run after ``delay`` (seconds or a timedelta) or at ``at``; returns
        it SCHEDULED at once. It takes a journal position like any call."""
        when = schedule(delay, at)
        key = self._core.position(self._catalog_for(tool), tool)
        return self.client.drive(self._core.submit(key, args, 0, **when))

    def get_scheduled_effects(self, tool: str | None = None) -> list[Effect]:
        """The run's SCHEDULED effects, earliest first."""
        return self.client.drive(self._core.listing("/scheduled", tool=tool))

    def remove_scheduled_effect(
        self, command_key: str | Effect, reason: str | None = None
    ) -> Effect:
        """Cancels an effect that has not started; returns it CANCELLED. Raises
        :class:`~sluice.errors.Conflict` if it already started."""
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return self.client.drive(self._core.remove(key, reason))

    def effects(self, *, status: str | None = None, tool: str | None = None) -> list[Effect]:
        """The run's effects in journal order, optionally by status and tool."""
        return self.client.drive(self._core.listing("/effects", status=status, tool=tool))

    def get(self, command_key: str) -> Effect:
        """One effect as it stands."""
        return self.client.drive(self._core.get(command_key))

    def wait(self, command_key: str | Effect, timeout: float | None = None) -> Effect:
        """Waits for an effect to end, through an approval or a resolution by a person too;
        returns it CONFIRMED or raises as :meth:`call` does (its status when the wait ends)."""
        effect = command_key if isinstance(command_key, Effect) else self.get(command_key)
        deadline = time.monotonic() + (self.client._config.wait if timeout is None else timeout)
        conversation = proto.poll(
            effect, deadline=deadline, retries=self.client._config.retries, through_people=True
        )
        return proto.outcome(self.client.drive(conversation))

    def approve(
        self,
        command_key: str | Effect,
        reason: str,
        *,
        args: Mapping[str, Any] | None = None,
    ) -> Effect:
        """Approves a BLOCKED effect (a token that may approve: an admin's); with ``args``,
        approves it edited to those arguments, whole — a revision of the same effect, checked
        against the tool's schema, policy and budgets. Returns it APPROVED. Raises
        :class:`~sluice.errors.InvalidRequest` (schema), :class:`~sluice.errors.BudgetExceeded`
        or :class:`~sluice.errors.Conflict` (``policy_denied``, not BLOCKED), changing nothing."""
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return self.client.drive(self._core.approve(key, reason, args))

    def approval_link(
        self,
        command_key: str | Effect,
        *,
        expires_in: int | None = None,
        recipient: str | None = None,
    ) -> ApprovalLink:
        """A signed, expiring, single-use link for a person to approve or reject the BLOCKED
        effect ``command_key`` without a login (an admin token is needed to make one).
        ``expires_in``: seconds, 60 to 604800 (default 86400); ``recipient``: whom it is for,
        recorded in the audit chain. The URL is the credential: send it only to its approver."""
        key = command_key.command_key if isinstance(command_key, Effect) else command_key
        return self.client.drive(self._core.approval_link(key, expires_in, recipient))

    def rollback(self, reason: str) -> RollbackProgress:
        """Rolls the run back: cancels what has not started, compensates what committed (last in
        the journal first), undoes what is in flight once its outcome is known. The run then
        takes no new effects. Returns at once; see :meth:`wait_rolled_back`."""
        return self.client.drive(self._core.rollback(reason))

    def rollback_progress(self) -> RollbackProgress:
        """Where the run's rollback stands, per command."""
        return self.client.drive(self._core.rollback_progress())

    def wait_rolled_back(self, timeout: float = 60.0, interval: float = 0.2) -> RollbackProgress:
        """Polls the rollback until it is done; raises TimeoutError with its progress if not."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.rollback_progress()
            if progress.done:
                return progress
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rollback of {self.run_id} not done after {timeout} s: {progress}"
                )
            time.sleep(interval)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text

"""What the sync and async clients share: configuration, the catalog cache, declaration checks
and the run's journal bookkeeping. No IO here (see ``_protocol.py``)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _protocol as proto
from ._ids import CommandKey, Journal, check_run_id, path_segment
from .catalog import Catalog, ToolDescription, check_declaration
from .effects import Declaration
from .models import ApprovalLink, Effect, RollbackProgress

DEFAULT_URL = "http://127.0.0.1:8700"
#: How long a call waits for its effect to settle, unless told otherwise.
DEFAULT_WAIT = 60.0


class ClientConfig:
    """Where the server is, who the client is, and how patiently it waits."""

    def __init__(
        self,
        url: str | None,
        token: str | None,
        wait: float,
        retries: proto.Retries,
    ) -> None:
        self.url = (url or os.environ.get("SLUICE_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("SLUICE_TOKEN")
        self.wait = wait
        self.retries = retries
        self.headers = {"accept": "application/json", "user-agent": "sluice-sdk-python"}
        if self.token:
            self.headers["authorization"] = f"Bearer {self.token}"
        self.catalog: Catalog | None = None
        self.checked: dict[tuple[str, str, bool], ToolDescription] = {}
        self.lock = threading.Lock()

    def check(self, catalog: Catalog, declaration: Declaration) -> ToolDescription:
        key = (declaration.tool, declaration.kind, declaration.allow_unsafe)
        with self.lock:
            found = self.checked.get(key)
        if found is None:
            found = check_declaration(
                catalog,
                declaration.tool,
                declaration.kind,
                allow_unsafe=declaration.allow_unsafe,
                function=declaration.function,
            )
            with self.lock:
                self.checked[key] = found
        return found

    def is_checked(self, declaration: Declaration) -> bool:
        with self.lock:
            return (declaration.tool, declaration.kind, declaration.allow_unsafe) in self.checked


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex}"


def tools_conversation(retries: proto.Retries) -> proto.Conversation[Catalog]:
    body = yield from proto.call("GET", "/v1/tools", retries)
    return Catalog.from_json(body)


def schedule(delay: float | timedelta | None, at: datetime | None) -> dict[str, Any]:
    """The submission fields of an effect due after ``delay`` or at ``at`` (exactly one)."""
    if delay is not None and at is None:
        return {"delay_ms": delay_ms(delay)}
    if at is not None and delay is None:
        return {"not_before": rfc3339(at)}
    raise ValueError("give exactly one of delay or at")


def delay_ms(delay: float | timedelta) -> int:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds < 0:
        raise ValueError(f"delay must not be negative, got {seconds} s")
    return int(seconds * 1000)


def rfc3339(at: datetime) -> str:
    if at.tzinfo is None:
        raise ValueError("`at` must be timezone-aware (e.g. datetime.now(timezone.utc))")
    utc = at.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


class RunCore:
    """A run's identity and journal, and the conversations of its operations."""

    def __init__(self, config: ClientConfig, run_id: str | None, tenant: str | None = None) -> None:
        self.run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        self.tenant = tenant
        self.config = config
        self.journal = Journal()
        self.lock = threading.Lock()

    def position(self, catalog: Catalog | None, tool: str) -> CommandKey:
        """Takes the next journal position of ``tool`` (qualified through ``catalog``)."""
        qualified = tool if catalog is None else catalog.resolve(tool)
        with self.lock:
            return self.journal.next_call(qualified)

    def decide(self) -> int:
        with self.lock:
            return self.journal.decide()

    @property
    def decision(self) -> int:
        return self.journal.decision

    def path(self, suffix: str = "") -> str:
        return f"/v1/runs/{path_segment(self.run_id)}{suffix}"

    def submit(
        self,
        key: CommandKey,
        args: Mapping[str, Any],
        wait: float | None,
        **schedule: Any,
    ) -> proto.Conversation[Effect]:
        return proto.submit(
            self.run_id,
            key,
            args,
            wait=self.config.wait if wait is None else wait,
            retries=self.config.retries,
            tenant=self.tenant,
            **schedule,
        )

    def get(self, command_key: str) -> proto.Conversation[Effect]:
        body = yield from proto.call(
            "GET",
            proto.effect_path(self.run_id, str(command_key)),
            self.config.retries,
            context=(self.run_id, str(command_key)),
        )
        return Effect.from_json(body)

    def listing(self, suffix: str, **filters: str | None) -> proto.Conversation[list[Effect]]:
        params = {name: value for name, value in filters.items() if value is not None}
        body = yield from proto.call("GET", self.path(suffix), self.config.retries, params=params)
        return [Effect.from_json(command) for command in body["effects"]]

    def remove(self, command_key: str, reason: str | None) -> proto.Conversation[Effect]:
        params = {"reason": reason} if reason else {}
        context = (self.run_id, str(command_key))
        request = proto.Request(
            "DELETE", proto.effect_path(self.run_id, str(command_key)), params=params
        )
        answer = yield from proto.send(
            request, self.config.retries, safe_to_repeat=True, context=context
        )
        if answer.status == 409 and isinstance(answer.body, dict) and "command" in answer.body:
            effect = Effect.from_json(answer.body["command"])
            error = proto.error_from(
                proto.Answer(409, answer.headers, {"error": answer.body.get("error", {})}),
                *context,
            )
            error.hint = (
                f"it is {effect.status}: only a SCHEDULED, PENDING, BLOCKED or APPROVED effect "
                "can be removed; a started one can be undone by rolling the run back."
            )
            raise error
        body = proto.expect(answer, 200, context=context)
        return Effect.from_json(body["command"])

    def approve(
        self, command_key: str, reason: str, args: Mapping[str, Any] | None
    ) -> proto.Conversation[Effect]:
        body: dict[str, Any] = {"reason": reason}
        if args is not None:
            body["args"] = dict(args)
        answer = yield from proto.call(
            "POST",
            proto.effect_path(self.run_id, str(command_key)) + ":approve",
            self.config.retries,
            json=body,
            safe_to_repeat=False,
            context=(self.run_id, str(command_key)),
        )
        return Effect.from_json(answer["command"])

    def approval_link(
        self, command_key: str, expires_in: int | None, recipient: str | None
    ) -> proto.Conversation[ApprovalLink]:
        payload: dict[str, Any] = {}
        if expires_in is not None:
            payload["expires_in_s"] = expires_in
        if recipient is not None:
            payload["for"] = recipient
        body = yield from proto.call(
            "POST",
            proto.effect_path(self.run_id, str(command_key)) + ":approval-link",
            self.config.retries,
            ok=(201,),
            json=payload,
            context=(self.run_id, str(command_key)),
        )
        return ApprovalLink.from_json(body)

    def rollback(self, reason: str) -> proto.Conversation[RollbackProgress]:
        body = yield from proto.call(
            "POST",
            self.path("/rollback"),
            self.config.retries,
            ok=(200, 202),
            json={"reason": reason},
            context=(self.run_id, None),
        )
        return RollbackProgress.from_json(self.run_id, body["progress"])

    def rollback_progress(self) -> proto.Conversation[RollbackProgress]:
        body = yield from proto.call("GET", self.path("/rollback"), self.config.retries)
        return RollbackProgress.from_json(self.run_id, body["progress"])

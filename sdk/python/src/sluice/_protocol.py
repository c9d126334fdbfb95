"""The HTTP conversation with the producer, without IO, shared by the sync and async clients.

Each operation is a generator that yields what it needs done (:class:`Request`, :class:`Sleep`)
and is sent back what happened (:class:`Answer` or :class:`NoAnswer`); ``client.py`` and
``aio.py`` drive it with httpx. So retries, waiting and the meaning of every answer are written
once, and the two clients cannot drift apart.

Retrying a submission is always safe: its idempotency key comes from the journal position, so
a submission that did reach the server is answered 200 with the stored command the second time.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ._ids import CommandKey, path_segment
from .errors import (
    ApiError,
    ArgumentDrift,
    BudgetExceeded,
    AwaitingApproval,
    BusinessKeyHeld,
    Conflict,
    EffectCancelled,
    EffectError,
    EffectFailed,
    EffectRolledBack,
    EffectStuck,
    EffectTimeout,
    Forbidden,
    InvalidRequest,
    NotFound,
    OverQuota,
    RunRolledBack,
    Unauthorized,
    Unavailable,
)
from .models import ROLLED_BACK, SETTLED, TERMINAL, Effect

#: The longest ``Prefer: wait`` / ``?wait=`` asked for at once (the server's default cap).
MAX_WAIT_PER_REQUEST = 60.0
#: Added to a held request's wait for its HTTP timeout.
TIMEOUT_GRACE = 15.0
#: How often an effect waiting for a person is looked at again.
PEOPLE_POLL = 0.5
#: HTTP timeout of a request that is not held.
PLAIN_TIMEOUT = 30.0

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = PLAIN_TIMEOUT


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


@dataclass(frozen=True)
class NoAnswer:
    """The request failed in transport (refused connection, reset, timeout)."""

    error: str


Op = Request | Sleep
Reply = Answer | NoAnswer | None
Conversation = Generator[Op, Reply, T]


@dataclass(frozen=True)
class Retries:
    """How often, and how long apart, a 503 or a lost request is tried again."""

    max_retries: int = 6
    base_delay: float = 0.25
    max_delay: float = 5.0

    def delay(self, attempt: int, headers: Mapping[str, str] | None) -> float:
        after = retry_after(headers) if headers is not None else None
        if after is not None:
            return min(after, 60.0)
        return float(min(self.base_delay * 2**attempt, self.max_delay))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), if the answer has one."""
    value = headers.get("retry-after")
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def effect_path(run_id: str, command_key: str) -> str:
    return f"/v1/runs/{path_segment(run_id)}/effects/{path_segment(command_key)}"


def wait_param(seconds: float) -> str:
    """A long poll's ``wait`` (whole seconds, or milliseconds below one second)."""
    if seconds >= 1:
        return f"{int(seconds)}s"
    return f"{max(1, int(seconds * 1000))}ms"


def send(
    request: Request,
    retries: Retries,
    *,
    safe_to_repeat: bool,
    context: tuple[str | None, str | None] = (None, None),
) -> Conversation[Answer]:
    """Sends ``request``; tries again on 503, and on a lost answer when ``safe_to_repeat``."""
    attempt = 0
    while True:
        reply = yield request
        if isinstance(reply, Answer) and reply.status != 503:
            return reply
        if attempt >= retries.max_retries or (isinstance(reply, NoAnswer) and not safe_to_repeat):
            if isinstance(reply, Answer):
                raise error_from(reply, *context)
            reason = reply.error if isinstance(reply, NoAnswer) else "no answer"
            raise Unavailable(
                0,
                "unreachable",
                f"{request.method} {request.path}: {reason}",
                run_id=context[0],
                command_key=context[1],
                hint="check that the Sluice server is running and reachable at the client's url",
            )
        yield Sleep(retries.delay(attempt, reply.headers if isinstance(reply, Answer) else None))
        attempt += 1


def expect(answer: Answer, *ok: int, context: tuple[str | None, str | None] = (None, None)) -> Any:
    """The answer's body if its status is one of ``ok``; else the typed error."""
    if answer.status in ok:
        return answer.body
    raise error_from(answer, *context)


def submit(
    run_id: str,
    key: CommandKey,
    args: Mapping[str, Any],
    *,
    wait: float,
    retries: Retries,
    delay_ms: int | None = None,
    not_before: str | None = None,
    tenant: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Conversation[Effect]:
    """Submits one effect at its journal position and waits up to ``wait`` seconds for it to
    settle: ``Prefer: wait`` on the submission, then long polls on the command. Returns the
    command as it stands then (settled or not); refusals raise their :class:`ApiError`."""
    deadline = clock() + wait
    body: dict[str, Any] = {
        "run_id": run_id,
        "decision": key.decision,
        "tool": key.tool,
        "call_idx": key.call_idx,
        "args": dict(args),
    }
    if delay_ms is not None:
        body["delay_ms"] = delay_ms
    if not_before is not None:
        body["not_before"] = not_before
    if tenant is not None:
        body["tenant"] = tenant
    context = (run_id, str(key))
    held = math.floor(min(wait, MAX_WAIT_PER_REQUEST))
    headers = {"prefer": f"wait={held}"} if held > 0 else {}
    request = Request(
        "POST", "/v1/effects", json=body, headers=headers, timeout=held + TIMEOUT_GRACE
    )
    answer = yield from send(request, retries, safe_to_repeat=True, context=context)
    effect = Effect.from_json(expect(answer, 200, 201, 202, context=context))
    settled = yield from poll(effect, deadline=deadline, retries=retries, clock=clock)
    # How the submission found the command is said by its answer only, not by the long polls.
    return replace(settled, existing=effect.existing)


def poll(
    effect: Effect,
    *,
    deadline: float,
    retries: Retries,
    through_people: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Conversation[Effect]:
    """Long-polls ``effect`` until it settles or ``deadline`` (a ``clock()`` time) passes.

    With ``through_people``, a BLOCKED or STUCK effect is waited on too, until a person's
    approval, rejection or resolution makes it terminal (the server answers long polls on such
    an effect at once, so these are polled every :data:`PEOPLE_POLL` seconds).
    """
    context = (effect.run_id, effect.command_key)
    done = TERMINAL if through_people else SETTLED
    while effect.status not in done:
        remaining = deadline - clock()
        if remaining <= 0:
            break
        held = min(remaining, MAX_WAIT_PER_REQUEST)
        params = {"wait": wait_param(held)}
        if effect.status in SETTLED:
            yield Sleep(min(PEOPLE_POLL, remaining))
            params = {}
        request = Request(
            "GET",
            effect_path(effect.run_id, effect.command_key),
            params=params,
            timeout=held + TIMEOUT_GRACE,
        )
        answer = yield from send(request, retries, safe_to_repeat=True, context=context)
        effect = Effect.from_json(expect(answer, 200, context=context))
    return effect


def outcome(effect: Effect) -> Effect:
    """``effect`` if CONFIRMED; else the :class:`EffectError` its status means."""
    error = effect_error(effect)
    if error is not None:
        raise error
    return effect


def effect_error(effect: Effect) -> EffectError | None:
    """The typed error of an effect that is not CONFIRMED, with what a person can do."""
    run, key, status = effect.run_id, effect.command_key, effect.status
    what = f"{effect.tool} at {run}/{key} is {status}"
    show = f"`sluice show {run} {key}`"
    if status == "CONFIRMED":
        return None
    if status == "FAILED":
        return EffectFailed(
            effect,
            f"{what}: {effect.last_error or 'the upstream refused it'}",
            f'fix the cause, then `sluice replay {run} {key} --reason "..."` (try '
            "`--dry-run` first); or make a new call at a new journal position (run.decide()).",
        )
    if status == "STUCK":
        return EffectStuck(
            effect,
            f"{what}: Sluice cannot tell whether it committed "
            f"({effect.last_error or 'no evidence'})"
            " and will not retry blindly",
            f"look it up upstream ({show} has the evidence), then settle it: "
            f'`sluice resolve {run} {key} --outcome confirmed --evidence <ref> --reason "..."` '
            f"or `--outcome failed`; or `sluice replay {run} {key} --evidence <proof it did not "
            'commit> --reason "..."`. Re-driving the agent then returns the outcome.',
        )
    if status == "BLOCKED":
        return AwaitingApproval(
            effect,
            f"{what}: its policy needs a person's approval; nothing has run",
            f'`sluice approve {run} {key} --reason "..."` (or `sluice reject {run} {key} '
            '--reason "..."`), then re-drive the agent, or wait for it with run.wait(...).',
        )
    if status == "CANCELLED" and effect.rejection is not None:
        rejection = effect.rejection
        return EffectCancelled(
            effect,
            f"{what}: {rejection.by} rejected it: {rejection.reason}",
            "It will not run. Change what the person objected to and ask again at a new "
            "journal position, or leave it.",
        )
    if status == "CANCELLED":
        return EffectCancelled(
            effect,
            f"{what}: it was cancelled, rejected or removed"
            + (f" ({effect.last_error})" if effect.last_error else ""),
            f"{show} says by whom and why; submit it again at a new journal position if it "
            "is still wanted.",
        )
    if status in ROLLED_BACK:
        escalated = status in {"COMPENSATION_FAILED", "NO_COMPENSATION"} or effect.escalated
        return EffectRolledBack(
            effect,
            f"{what}: its run was rolled back"
            + (" and nothing could undo it: a person must" if escalated else ""),
            f"`sluice rollback {run}` shows the rollback's progress; "
            + (f"undo it by hand upstream ({show})." if escalated else "start a new run."),
        )
    return EffectTimeout(
        effect,
        f"{what}: not settled when the wait ended; it goes on in Sluice",
        f"re-drive the agent with the same run id, or wait longer with run.wait({key!r}); "
        f"{show} shows it.",
    )


_HINTS = {
    401: "give the client a token: Client(token=...) or SLUICE_TOKEN (`sluice dev` prints one).",
    403: "use a token whose role may do this; an agent acts only in runs it submitted itself.",
    422: "fix the request: details name each failing JSON pointer.",
    429: "the tenant holds its whole quota of effects in flight; nothing was recorded: submit "
    "the same effect again after retry_after seconds, or once some of its effects settle.",
    503: "the server is overloaded or its ledger is unavailable; nothing was recorded: retry.",
}


def error_from(
    answer: Answer, run_id: str | None = None, command_key: str | None = None
) -> ApiError:
    """The typed error of an answer that is not a success."""
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    if isinstance(error, dict):
        code, message, details = (
            str(error.get("code", "error")),
            str(error.get("message", "")),
            error.get("details"),
        )
    else:
        code, message, details = "error", str(answer.body)[:500], None
    status = answer.status
    kind: type[ApiError] = ApiError
    hint = _HINTS.get(status, "")
    if status == 401:
        kind = Unauthorized
    elif status == 403:
        kind = Forbidden
    elif status == 404:
        kind = NotFound
        if code == "unknown_tool":
            hint = "the server's catalog has no such tool: client.tools() lists what it has."
    elif status == 422:
        kind = InvalidRequest
    elif status == 409:
        kind = Conflict
        if code == "argument_drift":
            kind = ArgumentDrift
            hint = (
                "this journal position was first taken with other arguments. A re-driven agent "
                "must make the same calls, with the same arguments, in the same order; for a "
                "new effect open a new decision (run.decide()) or start a new run."
            )
        elif code == "run_rolled_back":
            kind = RunRolledBack
            hint = f"start a new run; `sluice rollback {run_id}` shows what was undone."
        elif code == "budget_exceeded":
            kind = BudgetExceeded
            hint = (
                "the amount would pass a spend budget (the error's details say which, its limit "
                "and what is spent); nothing was recorded. Spend less, or wait for the budget's "
                "window to turn over."
            )
        elif code == "business_key_held":
            kind = BusinessKeyHeld
            hint = "another agent's command already holds this effect; do not submit it again."
    elif status == 429:
        kind = OverQuota
        after = retry_after(answer.headers)
        if after is None and isinstance(details, dict):
            after = details.get("retry_after_s")
        if after is not None:
            hint = (
                "the tenant holds its whole quota of effects in flight; nothing was recorded: "
                f"submit the same effect again after {after:g} s, or once some of its effects "
                "settle."
            )
    elif status == 503:
        kind = Unavailable
    return kind(status, code, message, details, run_id=run_id, command_key=command_key, hint=hint)


def call(
    method: str,
    path: str,
    retries: Retries,
    *,
    ok: tuple[int, ...] = (200,),
    params: dict[str, str] | None = None,
    json: Any = None,
    safe_to_repeat: bool = True,
    context: tuple[str | None, str | None] = (None, None),
) -> Conversation[Any]:
    """One request with retries; the body of an ``ok`` answer, else the typed error."""
    request = Request(method, path, params=params or {}, json=json)
    answer = yield from send(request, retries, safe_to_repeat=safe_to_repeat, context=context)
    return expect(answer, *ok, context=context)

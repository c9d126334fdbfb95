"""``@sluice.effect`` and ``@sluice.outbox_tool``: a function returns an effect's intent (its
arguments), Sluice records and executes it, and the decorated call returns the result.

Use ``@effect`` for IDEMPOTENT and OBSERVE_ONLY tools (safe to call again with the same key) and
``@outbox_tool`` for NON_IDEMPOTENT ones (may commit twice: never retried without evidence).
The declaration is checked against the server's catalog (``GET /v1/tools``) when a client is
given to the decorator, else when the function is first called in a run of a client; a
mismatch raises :class:`~sluice.errors.DeclarationError` before anything is recorded.

A decorated call takes the next journal position of its tool in the current decision of the
current run, so calls must happen in a run::

    with client.run("order-42") as run:
        refund(order="42", amount_minor=1250)     # d-1/payments/refund/0
        run.decide()
        notify(to="ops@example.com")              # d-2/email/send/0

A sync function needs a :class:`~sluice.Client` run, an ``async def`` one an
:class:`~sluice.AsyncClient` run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec

from ._context import current_run
from ._ids import InvalidId, check_tool_name
from .errors import DeclarationError, NoActiveRun

if TYPE_CHECKING:
    from .aio import AsyncClient, AsyncRun
    from .client import Client, Run

P = ParamSpec("P")


@dataclass(frozen=True)
class Declaration:
    """What a decorated function says about its tool."""

    tool: str
    kind: str  # "effect" or "outbox_tool"
    function: str
    allow_unsafe: bool = False
    #: Seconds to wait for the effect to settle; ``None``: the client's default.
    wait: float | None = None


def _check_name(tool: str, kind: str) -> None:
    if "/" in tool:
        try:
            check_tool_name(tool)
        except InvalidId as invalid:
            raise DeclarationError(f"@sluice.{kind}(tool={tool!r}): {invalid}") from None


def intent_of(declaration: Declaration, intent: object) -> Mapping[str, Any]:
    """The arguments a decorated function returned, checked to be a JSON object."""
    if not isinstance(intent, Mapping) or not all(isinstance(k, str) for k in intent):
        raise TypeError(
            f"{declaration.function}() is a Sluice effect for {declaration.tool}: it must return "
            f"the effect's arguments as a dict (the intent), not {type(intent).__name__}"
        )
    return intent


def _decorate(
    declaration: Declaration, client: Client | AsyncClient | None
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    _check_name(declaration.tool, declaration.kind)

    def decorate(function: Callable[P, Any]) -> Callable[P, Any]:
        declared = Declaration(
            declaration.tool,
            declaration.kind,
            getattr(function, "__qualname__", repr(function)),
            declaration.allow_unsafe,
            declaration.wait,
        )
        if client is not None:
            client.check(declared)
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                run: AsyncRun = _current(declared, want_async=True)
                intent = intent_of(declared, await function(*args, **kwargs))
                return (await run.invoke(declared, intent)).result

            wrapper: Any = run_async
        else:

            @functools.wraps(function)
            def run_sync(*args: P.args, **kwargs: P.kwargs) -> Any:
                run: Run = _current(declared, want_async=False)
                intent = intent_of(declared, function(*args, **kwargs))
                return run.invoke(declared, intent).result

            wrapper = run_sync
        wrapper.declaration = declared
        wrapper.intent = function
        return wrapper  # type: ignore[no-any-return]

    return decorate


def _current(declaration: Declaration, *, want_async: bool) -> Any:
    from .aio import AsyncRun

    run = current_run.get()
    if run is None:
        raise NoActiveRun(
            f"{declaration.function}() records an effect of {declaration.tool}, which belongs to "
            "a run: call it inside `with client.run(run_id):` (or `async with` an AsyncClient's "
            "run), so it gets its journal position and idempotency key"
        )
    if isinstance(run, AsyncRun) != want_async:
        kind = "an async def" if want_async else "a plain def"
        needs = "an AsyncClient" if want_async else "a Client"
        raise NoActiveRun(
            f"{declaration.function}() is {kind}, so it needs a run of {needs}; the current run "
            f"{run.run_id} belongs to a {type(run.client).__name__}"
        )
    return run


def effect(
    tool: str, *, client: Client | AsyncClient | None = None, wait: float | None = None
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Declares a function whose return value is the intent of an IDEMPOTENT or OBSERVE_ONLY
    effect of ``tool`` (``namespace/name``, or a bare name in the server's default namespace).

    The decorated call records the effect at the next journal position, waits up to ``wait``
    seconds (default: the client's) for it to settle and returns its result (the upstream's
    answer), or raises the :class:`~sluice.errors.EffectError` of its status. Refused when the
    server declares ``tool`` NON_IDEMPOTENT (use :func:`outbox_tool`) or does not know it.
    """
    return _decorate(Declaration(tool, "effect", "", False, wait), client)


def outbox_tool(
    tool: str,
    *,
    client: Client | AsyncClient | None = None,
    wait: float | None = None,
    allow_unsafe: bool = False,
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Declares a function whose return value is the intent of a NON_IDEMPOTENT effect of
    ``tool``: recorded in the ledger before it runs, executed once under its idempotency key, and
    never retried without evidence that the earlier attempt did not commit.

    Refused when the server does not know ``tool``, declares it other than NON_IDEMPOTENT, or
    gives it none of a business key, a status check or a compensate (an ambiguous outcome could
    then never be resolved) unless ``allow_unsafe``.
    """
    return _decorate(Declaration(tool, "outbox_tool", "", allow_unsafe, wait), client)

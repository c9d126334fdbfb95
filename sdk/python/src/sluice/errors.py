"""Every error the SDK raises, typed so an agent can tell what happened and a person what to do.

Two families:

* :class:`EffectError` — the effect was recorded and reached a status other than CONFIRMED
  (FAILED, STUCK, BLOCKED, CANCELLED, rolled back), or did not settle within the wait. Each
  carries the run id, the command key, the status and :attr:`~EffectError.remedy`: what a person
  can do, as the ``sluice`` console's command lines.
* :class:`ApiError` — the server refused the request (argument drift, a rolled-back run, an
  unknown tool, invalid arguments, a missing or weak token) or was unavailable; nothing new
  was recorded.

:class:`DeclarationError` is raised when a decorated tool does not match the server's catalog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Effect, Rejection


class SluiceError(Exception):
    """Base of every error raised by this SDK."""


class NoActiveRun(SluiceError, RuntimeError):
    """A decorated effect was called outside a run."""


class DeclarationError(SluiceError, TypeError):
    """A decorated tool does not match the server's catalog (refused before any call)."""


# --- the effect's outcome --------------------------------------------------------------------


class EffectError(SluiceError):
    """The effect was recorded but did not end CONFIRMED."""

    #: What a person can do about it (console command lines); set by each subclass.
    remedy: str = ""

    def __init__(self, effect: Effect, summary: str, remedy: str) -> None:
        self.effect = effect
        self.remedy = remedy
        super().__init__(f"{summary}\n  What to do: {remedy}")

    @property
    def run_id(self) -> str:
        return self.effect.run_id

    @property
    def command_key(self) -> str:
        return self.effect.command_key

    @property
    def idempotency_key(self) -> str:
        return self.effect.idempotency_key

    @property
    def status(self) -> str:
        return self.effect.status

    @property
    def tool(self) -> str:
        return self.effect.tool


class EffectFailed(EffectError):
    """FAILED: the upstream refused the effect (a 4xx), or it ran out of attempts uncommitted."""


class EffectStuck(EffectError):
    """STUCK: Sluice cannot tell whether the effect committed and will not guess: a person does."""


class AwaitingApproval(EffectError):
    """BLOCKED: the tool's policy needs a person's approval before the effect runs.

    Nothing ran. Once approved, re-driving the agent (or :meth:`Run.wait`) returns the result.
    """


class EffectCancelled(EffectError):
    """CANCELLED: the effect was cancelled, rejected or removed before it ran.

    ``rejection`` is set when a person rejected it while it waited for approval: who, and the
    reason they gave, which the message repeats for the model.
    """

    @property
    def rejection(self) -> Rejection | None:
        return self.effect.rejection


class EffectRolledBack(EffectError):
    """The effect was undone (COMPENSATING, COMPENSATED) or could not be (COMPENSATION_FAILED,
    NO_COMPENSATION, escalated to a person), usually because its run was rolled back."""


class EffectTimeout(EffectError):
    """The effect had not settled when the wait ended; it goes on in Sluice.

    Re-driving the agent with the same run id picks it up again at the same journal position.
    """


# --- the server's refusals -------------------------------------------------------------------


class ApiError(SluiceError):
    """The server refused a request (or could not be reached); nothing new was recorded."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        details: Any = None,
        *,
        run_id: str | None = None,
        command_key: str | None = None,
        hint: str = "",
    ) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details
        self.run_id = run_id
        self.command_key = command_key
        self.hint = hint
        where = f" [{run_id}/{command_key}]" if run_id and command_key else ""
        text = f"HTTP {status_code} {code}{where}: {message}"
        super().__init__(f"{text}\n  What to do: {hint}" if hint else text)


class Unauthorized(ApiError):
    """401: no token, or one the server does not know."""


class Forbidden(ApiError):
    """403: the token's role may not do this (e.g. an agent in another agent's run)."""


class NotFound(ApiError):
    """404: no such tool, run or command."""


class InvalidRequest(ApiError):
    """422: invalid ids or arguments; :attr:`violations` lists each failing JSON pointer."""

    @property
    def violations(self) -> list[dict[str, Any]]:
        if isinstance(self.details, dict):
            found = self.details.get("violations")
            if isinstance(found, list):
                return found
            if "pointer" in self.details:
                return [{"pointer": self.details["pointer"], "message": self.message}]
        return []


class Conflict(ApiError):
    """409: the request does not apply to the command or run as it is."""


class ArgumentDrift(Conflict):
    """409 ``argument_drift``: this journal position was first taken with other arguments.

    A re-driven agent must make the same calls, with the same arguments, in the same order.
    """


class RunRolledBack(Conflict):
    """409 ``run_rolled_back``: the run was rolled back and takes no new effects."""


class BusinessKeyHeld(Conflict):
    """409 ``business_key_held``: another agent's command holds this effect's business key."""


class BudgetExceeded(Conflict):
    """409 ``budget_exceeded``: the effect's amount would pass a spend budget (``[budgets.*]``)
    whose ``on_exceed`` is ``deny``; nothing was recorded (or, for an approver's edit, nothing
    changed). :attr:`budget`, :attr:`limit`, :attr:`spent` and :attr:`amount` say by how much,
    in the currency's minor units."""

    def _detail(self, name: str) -> Any:
        return self.details.get(name) if isinstance(self.details, dict) else None

    @property
    def budget(self) -> str | None:
        found = self._detail("budget")
        return str(found) if found is not None else None

    @property
    def currency(self) -> str | None:
        found = self._detail("currency")
        return str(found) if found is not None else None

    @property
    def limit(self) -> int | None:
        found = self._detail("limit")
        return int(found) if found is not None else None

    @property
    def spent(self) -> int | None:
        """What the budget's counter held already (``used``)."""
        found = self._detail("used")
        return int(found) if found is not None else None

    @property
    def amount(self) -> int | None:
        """This effect's amount."""
        found = self._detail("amount")
        return int(found) if found is not None else None


class OverQuota(ApiError):
    """429 ``tenant_over_quota``: the run's tenant already holds its whole quota of effects in
    flight (recorded, not yet in a final status). Nothing was recorded: submit the same effect
    again (same run, same journal position) after :attr:`retry_after` seconds."""

    def _detail(self, name: str) -> Any:
        return self.details.get(name) if isinstance(self.details, dict) else None

    @property
    def tenant(self) -> str | None:
        found = self._detail("tenant")
        return str(found) if found is not None else None

    @property
    def quota(self) -> int | None:
        found = self._detail("quota")
        return int(found) if found is not None else None

    @property
    def in_flight(self) -> int | None:
        found = self._detail("in_flight")
        return int(found) if found is not None else None

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before submitting again, as the server asked."""
        found = self._detail("retry_after_s")
        return float(found) if found is not None else None


class Unavailable(ApiError):
    """503 (ledger unavailable, dispatch backlog full) or no answer, after the client's retries."""

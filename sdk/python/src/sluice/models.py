"""What the server answers, as typed values: a command (:class:`Effect`) and rollback progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Statuses that end a command.
TERMINAL = frozenset(
    {"CONFIRMED", "FAILED", "CANCELLED", "COMPENSATED", "COMPENSATION_FAILED", "NO_COMPENSATION"}
)
#: Statuses a long poll returns on: terminal, or waiting for a person.
SETTLED = TERMINAL | {"STUCK", "BLOCKED"}
#: Statuses of an effect that was undone, or should have been and could not be.
ROLLED_BACK = frozenset({"COMPENSATING", "COMPENSATED", "COMPENSATION_FAILED", "NO_COMPENSATION"})


@dataclass(frozen=True)
class Rejection:
    """Who rejected an effect that waited for approval, and why (it is then CANCELLED)."""

    by: str
    reason: str
    at: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Rejection:
        return cls(by=body["by"], reason=body["reason"], at=body["at"])


@dataclass(frozen=True)
class Revision:
    """An approver's edit of an effect's arguments, made as they approved it. The effect keeps
    its key (one effect, corrected) and ran with the last revision's ``args``. ``changes`` lists
    each changed field by JSON pointer with its ``old`` and ``new`` values (a field the schema
    marks secret by pointer only)."""

    number: int
    args: dict[str, Any]
    args_hash: str
    previous_hash: str
    changes: list[dict[str, Any]]
    by: str
    reason: str
    at: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Revision:
        return cls(
            number=int(body["number"]),
            args=body.get("args") or {},
            args_hash=body["args_hash"],
            previous_hash=body["previous_hash"],
            changes=list(body.get("changes") or []),
            by=body["by"],
            reason=body["reason"],
            at=body["at"],
        )


@dataclass(frozen=True)
class Effect:
    """One command as the ledger holds it (``Command`` in schemas/openapi.yaml).

    ``result`` is the upstream's answer to the dispatch (its JSON body) once CONFIRMED;
    ``external_ref`` the reference the upstream gave the effect (e.g. a wire id). ``raw`` is the
    whole command as the server sent it.

    ``existing`` says, when a submission recorded nothing, how the command it was answered with
    was found: ``"command_key"`` (this journal position, recorded before) or ``"business_key"``
    (another command holds the tool's business key: it is the effect, and ``run_id`` and
    ``command_key`` are its own, possibly another run's). ``None`` when the submission recorded
    it, and on effects read rather than submitted.
    """

    run_id: str
    command_key: str
    idempotency_key: str
    tool: str
    status: str
    args: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    external_ref: str | None = None
    last_error: str | None = None
    escalated: bool = False
    not_before: str | None = None
    existing: str | None = None
    #: The tenant the effect counts against (its submitter, or the tenant its run named).
    tenant: str | None = None
    #: Set when a person rejected the effect while it waited for approval.
    rejection: Rejection | None = None
    #: Approvers' edits of the arguments, oldest first: it runs with the last one's ``args``.
    revisions: tuple[Revision, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Effect:
        return cls(
            run_id=body["run_id"],
            command_key=body["command_key"],
            idempotency_key=body["idempotency_key"],
            tool=body["tool"],
            status=body["status"],
            args=body.get("args") or {},
            result=body.get("result"),
            external_ref=body.get("external_ref"),
            last_error=body.get("last_error"),
            escalated=bool(body.get("escalated", False)),
            not_before=body.get("not_before"),
            existing=body.get("existing"),
            tenant=body.get("tenant"),
            rejection=Rejection.from_json(body["rejection"]) if body.get("rejection") else None,
            revisions=tuple(Revision.from_json(r) for r in body.get("revisions") or ()),
            raw=body,
        )

    @property
    def current_args(self) -> dict[str, Any]:
        """The arguments it runs (or ran) with: the last revision's, else ``args`` as submitted."""
        return self.revisions[-1].args if self.revisions else self.args

    @property
    def found_by_business_key(self) -> bool:
        """The submission was answered with another command holding the tool's business key
        (possibly another run's), not with one recorded at its own journal position."""
        return self.existing == "business_key"

    @property
    def settled(self) -> bool:
        """Terminal, or waiting for a person (STUCK, BLOCKED)."""
        return self.status in SETTLED


@dataclass(frozen=True)
class RollbackStep:
    """One command of a rollback, in compensation order."""

    command_key: str
    tool: str
    status: str
    escalated: bool
    compensation: dict[str, Any] | None


@dataclass(frozen=True)
class RollbackProgress:
    """Where a run's rollback stands. ``done`` once nothing is left to compensate."""

    run_id: str
    done: bool
    counts: dict[str, int]
    commands: list[RollbackStep]

    @classmethod
    def from_json(cls, run_id: str, progress: dict[str, Any]) -> RollbackProgress:
        return cls(
            run_id=run_id,
            done=bool(progress["done"]),
            counts=dict(progress.get("counts", {})),
            commands=[
                RollbackStep(
                    command_key=step["command_key"],
                    tool=step["tool"],
                    status=step["status"],
                    escalated=bool(step["escalated"]),
                    compensation=step.get("compensation"),
                )
                for step in progress.get("commands", [])
            ],
        )

    @property
    def escalated(self) -> list[RollbackStep]:
        """Commands a person must look at (nothing could undo them, or undoing failed)."""
        return [step for step in self.commands if step.escalated]


@dataclass(frozen=True)
class ApprovalLink:
    """A signed, expiring, single-use link that approves or rejects one BLOCKED effect without a
    login (``POST …:approval-link``). ``url`` is the credential: hand it only to its approver."""

    url: str
    link_id: str
    expires_at: str
    recipient: str | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ApprovalLink:
        return cls(
            url=body["url"],
            link_id=body["link_id"],
            expires_at=body["expires_at"],
            recipient=body.get("for"),
        )

    def __repr__(self) -> str:
        # The URL carries the token: kept out of logs that print the object.
        return (
            f"ApprovalLink(link_id={self.link_id!r}, expires_at={self.expires_at!r}, "
            f"recipient={self.recipient!r})"
        )

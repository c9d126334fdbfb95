"""Run ids, tool names, command keys and the journal position, exactly as the server spells them.

A command key is the journal position of one effect, ``d-<decision>/<namespace>/<name>/<call_idx>``;
the idempotency key is ``<run_id>/<command key>``. Both come from the position and never from the
arguments, so an agent re-driven from the start produces the same keys and gets the stored
results back (docs/architecture.md, "Vocabulary"). ``sdk/test-vectors/journal.json`` holds every
client of Sluice to these rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote

MAX_RUN_ID_LEN = 128
MAX_TOOL_SEGMENT_LEN = 64
MAX_INDEX = 2**32 - 1

_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SEGMENT = re.compile(r"[a-z][a-z0-9_]*")
_INDEX = re.compile(r"0|[1-9][0-9]*")


class InvalidId(ValueError):
    """A run id, tool name or command key that the server would refuse (422)."""


def check_run_id(run_id: str) -> str:
    """Returns ``run_id`` if it is 1 to 128 characters of ``[A-Za-z0-9._:-]``."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise InvalidId(
            f"run id {run_id!r} is invalid: it must be 1 to 128 characters of letters, "
            "digits and . _ : - (a '/' separates the run from the command key)"
        )
    return run_id


def _check_segment(segment: str, raw: str) -> None:
    if not segment:
        raise InvalidId(f"tool name {raw!r} has an empty segment")
    if len(segment) > MAX_TOOL_SEGMENT_LEN:
        raise InvalidId(f"tool name {raw!r}: segments must be at most 64 characters")
    if not _SEGMENT.fullmatch(segment):
        raise InvalidId(
            f"tool name {raw!r}: each segment must be snake_case "
            "(a lowercase letter, then lowercase letters, digits and _)"
        )


def check_tool_name(name: str) -> str:
    """Returns ``name`` if it is a qualified ``namespace/name``, both segments snake_case."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 2:
        raise InvalidId(f"tool name {name!r} must be qualified as namespace/name")
    for segment in parts:
        _check_segment(segment, name)
    return name


def resolve_tool(name: str, default_namespace: str) -> str:
    """A qualified name as it is; a bare name placed in ``default_namespace``."""
    return check_tool_name(name if "/" in name else f"{default_namespace}/{name}")


def _parse_index(raw: str) -> int | None:
    if not _INDEX.fullmatch(raw):
        return None
    value = int(raw)
    return value if value <= MAX_INDEX else None


@dataclass(frozen=True, order=True)
class CommandKey:
    """The journal position of one effect in its run."""

    decision: int
    tool: str
    call_idx: int

    def __post_init__(self) -> None:
        check_tool_name(self.tool)
        for what, value in (("decision", self.decision), ("call index", self.call_idx)):
            if not isinstance(value, int) or not 0 <= value <= MAX_INDEX:
                raise InvalidId(f"{what} {value!r} must be an integer from 0 to {MAX_INDEX}")

    @classmethod
    def parse(cls, raw: str) -> CommandKey:
        """Parses ``d-<decision>/<namespace>/<name>/<call_idx>`` in its one spelling."""
        parts = raw.split("/")
        if len(parts) != 4 or not parts[0].startswith("d-"):
            raise InvalidId(
                f"command key {raw!r} must look like d-<decision>/<namespace>/<name>/<call_idx>"
            )
        decision = _parse_index(parts[0][2:])
        call_idx = _parse_index(parts[3])
        if decision is None or call_idx is None:
            raise InvalidId(
                f"command key {raw!r}: decision and call index must be integers from 0 to "
                f"{MAX_INDEX}, without leading zeros"
            )
        return cls(decision, check_tool_name(f"{parts[1]}/{parts[2]}"), call_idx)

    def __str__(self) -> str:
        return f"d-{self.decision}/{self.tool}/{self.call_idx}"

    def idempotency_key(self, run_id: str) -> str:
        """``<run_id>/<command key>``: what every call of the effect carries upstream."""
        return f"{check_run_id(run_id)}/{self}"

    @property
    def path_segment(self) -> str:
        """The key as one URL path segment (``/`` and ``%`` percent-encoded)."""
        return path_segment(str(self))


def path_segment(text: str) -> str:
    """``text`` percent-encoded as one URL path segment."""
    return quote(text, safe="")


@dataclass
class Journal:
    """Where an agent is in its run: the decision, and how many calls of each tool it made in it.

    A journal starts in decision 1. :meth:`decide` opens the next decision and restarts every
    tool's call index at 0; :meth:`next_call` numbers the calls of one tool from 0 in the order
    they are made. Tools must be qualified (resolve bare names first), so that ``send`` and
    ``default/send`` count as the same tool.
    """

    decision: int = 1
    _calls: dict[str, int] = field(default_factory=dict, repr=False)

    def decide(self) -> int:
        """Opens the next decision and returns its number."""
        self.decision = min(self.decision + 1, MAX_INDEX)
        self._calls.clear()
        return self.decision

    def next_call(self, tool: str) -> CommandKey:
        """The key of the next call of ``tool`` in this decision; counts the call."""
        index = self._calls.get(check_tool_name(tool), 0)
        self._calls[tool] = min(index + 1, MAX_INDEX)
        return CommandKey(self.decision, tool, index)

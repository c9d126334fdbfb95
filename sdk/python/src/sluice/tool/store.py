"""Idempotency-key stores for :class:`~sluice.tool.ToolApp`: what a tool answered to each key,
so a replay gets the stored answer instead of a second effect.

A record goes ``in_progress`` (taken atomically: one request per key runs the function) →
``done`` (the answer is stored: a result or a refusal) or ``in_doubt`` (the function raised: it
may or may not have committed; a later request with the key runs it again, which Sluice sends
only with the same key for an IDEMPOTENT tool, or after evidence that nothing committed).

Two stores ship:

* :class:`MemoryStore` (the default) lives in the process. **A restart loses every record**: a
  replay after it runs the function again, and lookups cannot prove that an effect is absent,
  so they answer "inconclusive" rather than "absent" (Sluice then waits for a person instead
  of redispatching on a false absence).
* :class:`SQLiteStore` keeps the records in a SQLite file (fsync'd on every write), so replays
  and lookups survive restarts.

Any object with the methods of :class:`IdempotencyStore` can be plugged in (e.g. on the tool's
own database, written in the same transaction as its effect).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

IN_PROGRESS = "in_progress"
DONE = "done"
IN_DOUBT = "in_doubt"


@dataclass(frozen=True)
class Record:
    """What a store holds for one (tool, idempotency key)."""

    tool: str
    key: str
    args_hash: str
    state: str
    business_key: str | None = None
    status: int | None = None
    body: Any = None
    external_ref: str | None = None
    created_at: float = 0.0

    @property
    def committed(self) -> bool:
        """Done with a 2xx answer: the effect happened."""
        return self.state == DONE and self.status is not None and 200 <= self.status < 300


class IdempotencyStore(Protocol):
    """What :class:`~sluice.tool.ToolApp` needs from a store. Every method is atomic."""

    #: Whether the store survives restarts: only then may a lookup answer "absent".
    durable: bool

    def begin(self, record: Record) -> Record | None:
        """Stores ``record`` (``in_progress``) if its key is new and returns None; else returns
        the existing record, unchanged."""
        ...

    def retake(self, tool: str, key: str) -> bool:
        """``in_doubt`` → ``in_progress``; False if the record is not ``in_doubt``."""
        ...

    def finish(self, tool: str, key: str, status: int, body: Any, external_ref: str | None) -> None:
        """``in_progress`` → ``done`` with the answer."""
        ...

    def doubt(self, tool: str, key: str) -> None:
        """``in_progress`` → ``in_doubt``."""
        ...

    def by_business_key(self, tool: str, business_key: str) -> list[Record]:
        """Every record of ``tool`` with ``business_key``, oldest first."""
        ...

    def get(self, tool: str, key: str) -> Record | None: ...


class MemoryStore:
    """Records in a dict, for tests and tools whose function is idempotent by itself.

    Lost on restart (see the module documentation)."""

    durable = False

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], Record] = {}
        self._lock = threading.Lock()

    def begin(self, record: Record) -> Record | None:
        with self._lock:
            existing = self._records.get((record.tool, record.key))
            if existing is None:
                self._records[(record.tool, record.key)] = replace(
                    record, state=IN_PROGRESS, created_at=time.time()
                )
            return existing

    def retake(self, tool: str, key: str) -> bool:
        return self._move(tool, key, IN_DOUBT, state=IN_PROGRESS)

    def finish(self, tool: str, key: str, status: int, body: Any, external_ref: str | None) -> None:
        self._move(
            tool, key, IN_PROGRESS, state=DONE, status=status, body=body, external_ref=external_ref
        )

    def doubt(self, tool: str, key: str) -> None:
        self._move(tool, key, IN_PROGRESS, state=IN_DOUBT)

    def by_business_key(self, tool: str, business_key: str) -> list[Record]:
        with self._lock:
            found = [
                r
                for r in self._records.values()
                if r.tool == tool and r.business_key == business_key
            ]
        return sorted(found, key=lambda r: r.created_at)

    def get(self, tool: str, key: str) -> Record | None:
        with self._lock:
            return self._records.get((tool, key))

    def _move(self, tool: str, key: str, expected: str, **change: Any) -> bool:
        with self._lock:
            record = self._records.get((tool, key))
            if record is None or record.state != expected:
                return False
            self._records[(tool, key)] = replace(record, **change)
            return True


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sluice_tool_keys (
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    business_key TEXT,
    status INTEGER,
    body TEXT,
    external_ref TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (tool, key)
);
CREATE INDEX IF NOT EXISTS sluice_tool_keys_by_business_key
    ON sluice_tool_keys (tool, business_key);
"""
_COLUMNS = "tool, key, args_hash, state, business_key, status, body, external_ref, created_at"


class SQLiteStore:
    """Records in a SQLite file, durable across restarts (WAL, ``synchronous=FULL``)."""

    durable = True

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def begin(self, record: Record) -> Record | None:
        with self._lock:
            inserted = self._db.execute(
                f"INSERT OR IGNORE INTO sluice_tool_keys ({_COLUMNS}) "
                "VALUES (?,?,?,?,?,NULL,NULL,NULL,?)",
                (
                    record.tool,
                    record.key,
                    record.args_hash,
                    IN_PROGRESS,
                    record.business_key,
                    time.time(),
                ),
            ).rowcount
            if inserted:
                return None
            return self._get(record.tool, record.key)

    def retake(self, tool: str, key: str) -> bool:
        with self._lock:
            return bool(
                self._db.execute(
                    "UPDATE sluice_tool_keys SET state=? WHERE tool=? AND key=? AND state=?",
                    (IN_PROGRESS, tool, key, IN_DOUBT),
                ).rowcount
            )

    def finish(self, tool: str, key: str, status: int, body: Any, external_ref: str | None) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE sluice_tool_keys SET state=?, status=?, body=?, external_ref=? "
                "WHERE tool=? AND key=? AND state=?",
                (DONE, status, json.dumps(body), external_ref, tool, key, IN_PROGRESS),
            )

    def doubt(self, tool: str, key: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE sluice_tool_keys SET state=? WHERE tool=? AND key=? AND state=?",
                (IN_DOUBT, tool, key, IN_PROGRESS),
            )

    def by_business_key(self, tool: str, business_key: str) -> list[Record]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM sluice_tool_keys WHERE tool=? AND business_key=? "
                "ORDER BY created_at, rowid",
                (tool, business_key),
            ).fetchall()
        return [_record(row) for row in rows]

    def get(self, tool: str, key: str) -> Record | None:
        with self._lock:
            return self._get(tool, key)

    def _get(self, tool: str, key: str) -> Record | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM sluice_tool_keys WHERE tool=? AND key=?", (tool, key)
        ).fetchone()
        return _record(row) if row else None


def _record(row: tuple[Any, ...]) -> Record:
    tool, key, args_hash, state, business_key, status, body, external_ref, created_at = row
    return Record(
        tool=tool,
        key=key,
        args_hash=args_hash,
        state=state,
        business_key=business_key,
        status=status,
        body=json.loads(body) if body is not None else None,
        external_ref=external_ref,
        created_at=created_at,
    )

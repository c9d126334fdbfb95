"""The run a decorated effect belongs to: the innermost ``with client.run(...)`` of this context.

A :class:`contextvars.ContextVar`, so concurrent asyncio tasks and threads each see their own run.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

current_run: ContextVar[Any] = ContextVar("sluice_current_run", default=None)

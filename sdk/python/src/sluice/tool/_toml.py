"""Just enough TOML writing for catalog entries: inline tables for schemas, arrays, scalars."""

from __future__ import annotations

import json
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def value(item: Any) -> str:
    """One TOML value; dicts become inline tables. (JSON string escapes are valid TOML.)"""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | float):
        return repr(item)
    if isinstance(item, str):
        return json.dumps(item, ensure_ascii=False)
    if isinstance(item, list | tuple):
        return "[" + ", ".join(value(element) for element in item) + "]"
    if isinstance(item, dict):
        if not item:
            return "{}"
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + " }"
    raise TypeError(f"cannot write {type(item).__name__} as TOML: {item!r}")


def table(header: str, entries: dict[str, Any]) -> list[str]:
    lines = [header] if header else []
    lines += [f"{key(name)} = {value(item)}" for name, item in entries.items() if item is not None]
    return lines

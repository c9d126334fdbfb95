"""The fault rules the stdio wrapper (wrapper.py) and the HTTP fault proxy (proxy.py) share.

They are the fault injectors between Sluice and a real MCP server, not stand-ins for it: every
message goes to the real server, and a fault only withholds an answer or kills the server.

A test chooses faults by writing a control file (JSON), read again at every `tools/call`:

    {"rules": [{"id": "drop-commit", "tool": "git_commit", "nth": 1, "action": "drop"}]}

- `tool`: the server's own tool name in `params.name` of a `tools/call`.
- `nth`: the rule fires on the nth `tools/call` of that tool counted from when the rule was
  first seen (1 = the next one); it fires once.
- `action`:
  - `drop`: forward the request, let the server answer (it acted), swallow the answer and close
    the stream (stdio: the wrapper closes its stdout and exits, its server with it; HTTP: the
    proxy closes the client's connection without a byte of the answer).
  - `lose`: the request never reaches the server: swallowed, and the stream closed as for
    `drop` (the server certainly did not act, yet the sender cannot know that).
  - `kill`: forward the request, then SIGKILL the server mid-call: `when = "answer"` (default)
    the moment its answer shows up (so it certainly acted and died before anyone heard),
    `when = "request"` `delay_ms` after the request was written (whatever it had done by then).

The counts and what fired live in `<control>.state` (so they survive the wrapper being started
again after a fault) and each step is appended to `<control>.log` as a JSON line — the tests read
it to know that the fault really happened.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fault:
    rule_id: str
    action: str  # "drop" | "kill" | "lose"
    when: str  # "answer" | "request"
    delay_ms: int


class Rules:
    def __init__(self, control: str | None) -> None:
        self.control = control

    def _locked(self) -> Any:
        assert self.control is not None
        lock = open(self.control + ".lock", "a")  # noqa: SIM115 (closed by the caller)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return lock

    def log(self, event: str, **fields: Any) -> None:
        if not self.control:
            return
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
        with open(self.control + ".log", "a") as sink:
            sink.write(line + "\n")

    def on_call(self, tool: str) -> Fault | None:
        """Counts a `tools/call` of `tool` and returns the fault that fires on it, if any."""
        if not self.control:
            return None
        lock = self._locked()
        try:
            try:
                with open(self.control) as source:
                    rules = json.load(source).get("rules", [])
            except FileNotFoundError:
                return None
            state_path = self.control + ".state"
            try:
                with open(state_path) as source:
                    state = json.load(source)
            except FileNotFoundError:
                state = {}
            fired: Fault | None = None
            for rule in rules:
                if rule.get("tool") != tool:
                    continue
                entry = state.setdefault(rule["id"], {"seen": 0, "fired": False})
                if entry["fired"]:
                    continue
                entry["seen"] += 1
                if fired is None and entry["seen"] >= int(rule.get("nth", 1)):
                    entry["fired"] = True
                    action = rule.get("action", "drop")
                    if action not in ("drop", "kill", "lose"):
                        raise ValueError(f"fault rule {rule['id']}: unknown action {action!r}")
                    fired = Fault(
                        rule_id=rule["id"],
                        action=action,
                        when=rule.get("when", "answer"),
                        delay_ms=int(rule.get("delay_ms", 0)),
                    )
            with open(state_path + ".tmp", "w") as sink:
                json.dump(state, sink)
            os.replace(state_path + ".tmp", state_path)
            return fired
        finally:
            lock.close()


def call_of(message: Any) -> tuple[str, Any] | None:
    """(tool name, JSON-RPC id) when the message is a `tools/call` request."""
    if isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message:
        params = message.get("params") or {}
        name = params.get("name")
        if isinstance(name, str):
            return name, message["id"]
    return None


def id_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def meta_of(raw: bytes) -> Any:
    """The `_meta` and arguments of a `tools/call` as sent (what the tests check the keys in)."""
    try:
        params = json.loads(raw).get("params") or {}
    except (ValueError, AttributeError):
        return None
    return {"_meta": params.get("_meta"), "arguments": params.get("arguments")}

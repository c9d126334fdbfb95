"""``ToolApp``: plain Python functions served as an upstream that speaks Sluice's tool wire
contract (docs/architecture.md, "Wire contract"), as an ASGI application.

For each tool ``namespace/name`` it serves:

* ``POST /namespace/name`` — dispatch: the JSON body is the arguments, passed to the function as
  keyword arguments. The ``Idempotency-Key`` header is recorded first (one request per key runs
  the function); a replay gets the stored answer with ``Idempotent-Replayed: true``; a request
  while the first is still running gets ``409`` (the catalog entry declares
  ``in_progress_status = [409]``, so Sluice reads it as ambiguous, not as a refusal). A result is
  answered ``201`` with the result as the body (its ``id`` is the effect's reference); raising
  :class:`Refused` answers its 4xx (Sluice: FAILED); any other exception answers ``500`` (Sluice:
  outcome unknown, reconciled).
* ``GET /namespace/name/by-key/{business_key}`` (or ``…/by-idempotency-key/{key}`` for a tool
  with a status function and no business key) — status check: ``200`` present, ``404`` absent,
  ``409`` duplicate (``refs``: every commit), ``503`` inconclusive. Answered by the tool's status
  function when it has one (the system of record), else from the store.
* ``POST /namespace/name/compensate/{external_ref}`` — compensate, with ``{"args",
  "external_ref"}`` as the body and its own ``Idempotency-Key`` (replays answered from the
  store): ``200`` done, :class:`Refused` → its 4xx (cannot be undone: escalated), other
  exceptions ``500`` (retried).

Every request, on every route, must first be a signed call from Sluice (Standard Webhooks,
:mod:`sluice.tool.signing`): an unsigned or badly signed one, one whose timestamp is more than 5
minutes off, or a replayed one is answered ``401`` before its body is parsed or any function
runs. The keys are ``signing_keys=`` or the ``SLUICE_TOOL_SIGNING_KEYS`` variable; an app with
neither refuses to be built unless ``allow_unsigned=True``.

:meth:`ToolApp.catalog_toml` prints the catalog entries that point Sluice at these routes, and
the credential it signs with.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import anyio.to_thread

from .._ids import InvalidId, check_tool_name
from ..catalog import IDEMPOTENT, NON_IDEMPOTENT, OBSERVE_ONLY
from ..errors import DeclarationError
from . import _toml
from .signing import ENV_VAR, Rejected, SigningKeyError, Verifier, parse_keys
from .store import DONE, IN_DOUBT, IN_PROGRESS, IdempotencyStore, MemoryStore, Record

_log = logging.getLogger("sluice.tool")

#: The credential the printed catalog names when the caller names none.
DEFAULT_CREDENTIAL = "tool_services"
# Sluice refuses a credential name that is not snake_case (as a tool name's segments).
_CREDENTIAL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}
_SCALARS = {"string", "integer", "number", "boolean"}

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Refused(Exception):
    """Raised by a tool function: the effect definitively did not happen, and will not if asked
    again (answered with ``status``, a 4xx other than 408/425/429; Sluice records FAILED, or for
    a compensation escalates it to a person)."""

    def __init__(self, message: str, status: int = 422, details: Any = None) -> None:
        if not 400 <= status < 500 or status in (408, 425, 429):
            raise ValueError(f"a refusal is a 4xx other than 408, 425 and 429, not {status}")
        super().__init__(message)
        self.message = message
        self.status = status
        self.details = details


@dataclass(frozen=True)
class Call:
    """The wire contract's headers of one request, for functions that ask for ``call``."""

    idempotency_key: str
    run_id: str | None = None
    command_key: str | None = None
    business_key: str | None = None
    #: On a compensation: the idempotency key of the dispatch it undoes.
    dispatch_idempotency_key: str | None = None


@dataclass(frozen=True)
class ToolSpec:
    """One tool served by a :class:`ToolApp`, as declared."""

    name: str
    semantics: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    description: str = ""
    business_key: str | None = None
    status: Callable[..., Any] | None = None
    compensate: Callable[..., Any] | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    allow_unsafe: bool = False

    @property
    def path(self) -> str:
        return "/" + self.name

    @property
    def has_status_check(self) -> bool:
        return self.status is not None or self.business_key is not None

    @property
    def status_path(self) -> str:
        if self.business_key is not None:
            return f"{self.path}/by-key/{{business_key}}"
        return f"{self.path}/by-idempotency-key/{{idempotency_key}}"


class ToolApp:
    """An ASGI application serving tool functions under Sluice's wire contract.

    ``store`` keeps each idempotency key's answer; the default :class:`MemoryStore` loses them
    on restart (see :mod:`sluice.tool.store`), :class:`SQLiteStore` keeps them.

    ``signing_keys``: the ``whsec_`` keys Sluice signs its calls with (a list, or one string of
    whitespace-separated keys); when not given, the ``SLUICE_TOOL_SIGNING_KEYS`` variable. Each
    request must carry a signature by one of them (during a rotation, list both). With no key
    at all the app refuses to be built (:class:`~sluice.tool.SigningKeyError`), unless
    ``allow_unsigned=True``: then it serves anyone who can reach it, which is for a local
    experiment only (a warning is logged). A key given always wins over ``allow_unsigned``.
    """

    def __init__(
        self,
        store: IdempotencyStore | None = None,
        *,
        signing_keys: Iterable[str] | str | None = None,
        allow_unsigned: bool = False,
    ) -> None:
        self.store: IdempotencyStore = store if store is not None else MemoryStore()
        self.tools: dict[str, ToolSpec] = {}
        if signing_keys is None:
            keys = os.environ.get(ENV_VAR, "").split()
            source = f"the {ENV_VAR} environment variable"
        else:
            keys = signing_keys.split() if isinstance(signing_keys, str) else list(signing_keys)
            source = "signing_keys"
        self._verifier: Verifier | None = None
        if keys:
            self._verifier = Verifier(parse_keys(keys, source))
        elif allow_unsigned:
            _log.warning(
                "ToolApp(allow_unsigned=True) with no signing key: anyone who can reach this "
                "service can call its tools (create, refund, read effects). For a local "
                "experiment only; set %s anywhere else.",
                ENV_VAR,
            )
        else:
            given = "signing_keys is empty" if signing_keys is not None else f"{ENV_VAR} is not set"
            raise SigningKeyError(
                f"ToolApp has no signing key ({given}), so it cannot tell Sluice's calls from "
                f"anyone else's. Set {ENV_VAR} to the whsec_ keys Sluice signs with "
                "(whitespace-separated; sluice.tool.new_signing_key() makes one), or pass "
                "signing_keys=[...]; or, for a local experiment only, pass allow_unsigned=True."
            )

    @property
    def verifies_signatures(self) -> bool:
        """Whether requests must be signed (False only when built with ``allow_unsigned`` and
        no key)."""
        return self._verifier is not None

    def tool(
        self,
        name: str,
        *,
        semantics: str,
        business_key: str | None = None,
        status: Callable[..., Any] | None = None,
        compensate: Callable[..., Any] | None = None,
        schema: dict[str, Any] | None = None,
        description: str | None = None,
        policy: Mapping[str, Any] | None = None,
        allow_unsafe: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Serves the decorated function as the dispatch of tool ``name`` (``namespace/name``).

        ``semantics``: IDEMPOTENT, NON_IDEMPOTENT or OBSERVE_ONLY. ``business_key``: a template
        over the arguments (``"{order}:{amount_minor}"``) the effect is looked up by.
        ``status(business_key | idempotency_key | call)`` returns the effect's record (a dict
        with its ``id``), ``None`` if absent, or a list of records if it committed more than
        once; raising means inconclusive. ``compensate(external_ref, args, call)`` undoes a
        commit. ``schema`` defaults to one derived from the function's signature; ``policy`` is
        written to the catalog entry's ``[tool.policy]``.

        A NON_IDEMPOTENT tool with none of ``business_key``, ``status`` and ``compensate`` is
        refused (an ambiguous outcome could never be resolved) unless ``allow_unsafe``.
        """

        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            spec = ToolSpec(
                name=name,
                semantics=semantics,
                function=function,
                schema=schema if schema is not None else schema_of(function),
                description=description if description is not None else _summary(function),
                business_key=business_key,
                status=status,
                compensate=compensate,
                policy=dict(policy or {}),
                allow_unsafe=allow_unsafe,
            )
            self._check(spec)
            self.tools[name] = spec
            return function

        return decorate

    def _check(self, spec: ToolSpec) -> None:
        function = getattr(spec.function, "__qualname__", spec.function)
        where = f"ToolApp.tool({spec.name!r}) on {function}()"
        try:
            check_tool_name(spec.name)
        except InvalidId as invalid:
            raise DeclarationError(f"{where}: {invalid}") from None
        if spec.name in self.tools:
            raise DeclarationError(f"{where}: a tool named {spec.name} is already served")
        if spec.semantics not in (IDEMPOTENT, NON_IDEMPOTENT, OBSERVE_ONLY):
            raise DeclarationError(
                f"{where}: semantics must be IDEMPOTENT, NON_IDEMPOTENT or OBSERVE_ONLY, "
                f"not {spec.semantics!r}"
            )
        if (
            spec.semantics == NON_IDEMPOTENT
            and not (spec.business_key or spec.status or spec.compensate)
            and not spec.allow_unsafe
        ):
            raise DeclarationError(
                f"{where}: a NON_IDEMPOTENT tool needs a way to resolve an ambiguous outcome, and "
                "this one has none. When a call times out, Sluice must find out whether it "
                "committed before it may send it again. Give it a business_key (the effect's "
                "identity, looked up in the store), a status= function that looks the effect up "
                "in your system of record, or a compensate= function that undoes it; or "
                "allow_unsafe=True after review (every ambiguous outcome then waits for a person)."
            )
        if spec.semantics == OBSERVE_ONLY and spec.compensate is not None:
            raise DeclarationError(
                f"{where}: an OBSERVE_ONLY tool is a read and is never compensated; drop "
                "compensate= or declare the tool IDEMPOTENT"
            )
        if spec.business_key is not None:
            properties = spec.schema.get("properties", {})
            required = set(spec.schema.get("required", []))
            for placeholder in _PLACEHOLDER.findall(spec.business_key):
                kind = properties.get(placeholder, {}).get("type")
                if placeholder not in properties or placeholder not in required:
                    raise DeclarationError(
                        f"{where}: business_key {spec.business_key!r} names {placeholder!r}, "
                        "which must be a required argument (a parameter without a default)"
                    )
                if kind is not None and kind not in _SCALARS:
                    raise DeclarationError(
                        f"{where}: business_key names {placeholder!r}, a {kind}; only "
                        "strings, numbers and booleans can be part of a key"
                    )

    def catalog_toml(
        self,
        base_url: str,
        *,
        credential: str | None = None,
        keys_env: str | None = None,
        keys_file: str | None = None,
    ) -> str:
        """The catalog entries pointing Sluice at this app at ``base_url``: the credential Sluice
        signs with (``[credentials.<credential>]``), then a ``[[tool]]`` table per tool naming it.

        ``credential`` names it (default ``tool_services``); Sluice reads its keys from the
        variable ``keys_env`` (default ``SLUICE_TOOL_SIGNING_KEYS``) or the file ``keys_file``
        (whitespace-separated ``whsec_`` keys). No key's value is ever printed. An app built with
        ``allow_unsigned`` and no key prints no credential unless one is asked for. Two apps in
        one catalog each print their credential: give them different names.

        Paste them into the catalog (see deploy/catalog.toml for every field)."""
        if keys_env is not None and keys_file is not None:
            raise ValueError("Sluice reads the keys from keys_env or keys_file, not both")
        if credential is None and (self.verifies_signatures or keys_env or keys_file):
            credential = DEFAULT_CREDENTIAL
        if credential is not None and not _CREDENTIAL_NAME.fullmatch(credential):
            raise ValueError(
                f"credential name {credential!r}: Sluice takes snake_case (a lowercase letter, "
                "then lowercase letters, digits and _; at most 64 characters)"
            )
        if keys_env is not None and not _ENV_NAME.fullmatch(keys_env):
            raise ValueError(f"keys_env {keys_env!r} is not an environment variable's name")
        base = base_url.rstrip("/")
        lines: list[str] = []
        if credential is not None:
            source = {"file": keys_file} if keys_file is not None else {"env": keys_env or ENV_VAR}
            lines += _toml.table(
                f"[credentials.{credential}]", {"kind": "standard_webhooks", "keys": [source]}
            )
            lines.append("")
        for spec in self.tools.values():
            lines.append("[[tool]]")
            lines += _toml.table(
                "",
                {
                    "name": spec.name,
                    "credential": credential,
                    "description": spec.description or None,
                    "semantics": spec.semantics,
                    "business_key": spec.business_key,
                    "allow_unsafe": True if spec.allow_unsafe else None,
                    "schema": spec.schema,
                },
            )
            if spec.policy:
                lines += ["", *_toml.table("[tool.policy]", spec.policy)]
            lines += [
                "",
                *_toml.table(
                    "[tool.dispatch]",
                    {
                        "url": base + spec.path,
                        "reference_pointer": "/id",
                        "in_progress_status": [409],
                    },
                ),
            ]
            if spec.has_status_check:
                # Sluice reads a status code as absent or duplicate only when declared: a 404
                # from a proxy in front of a wrong URL must not pass for "never happened".
                lines += [
                    "",
                    *_toml.table(
                        "[tool.status_check]",
                        {
                            "url": base + spec.status_path,
                            "absent_status": [404],
                            "duplicate_status": [409],
                        },
                    ),
                ]
            if spec.compensate is not None:
                url = f"{base}{spec.path}/compensate/{{external_ref}}"
                lines += ["", *_toml.table("[tool.compensate]", {"url": url})]
            lines.append("")
        return "\n".join(lines)

    # --- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        raw = scope.get("raw_path") or scope["path"].encode()
        segments = [unquote(part) for part in raw.decode("latin-1").split("?")[0].split("/")[1:]]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # Verified before anything else, on every route: an unsigned request is refused before
        # its body is even read, a badly signed one before it is parsed or any function runs.
        if self._verifier is not None:
            try:
                self._verifier.check_headers(headers)
            except Rejected as rejected:
                return await self._refuse(send, scope, rejected)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self._verifier is not None:
            try:
                self._verifier.verify(headers, body)
            except Rejected as rejected:
                return await self._refuse(send, scope, rejected)
        await _respond(send, *await self._route(scope["method"], segments, headers, body))

    async def _refuse(self, send: Send, scope: Scope, rejected: Rejected) -> None:
        _log.warning(
            "refused %s %s from %s: %s",
            scope["method"],
            scope["path"],
            (scope.get("client") or ("?",))[0],
            rejected,
        )
        await _respond(send, *_error(401, str(rejected)))

    async def _route(
        self, method: str, segments: list[str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        if len(segments) < 2:
            return _error(404, "no route")
        spec = self.tools.get("/".join(segments[:2]))
        rest = segments[2:]
        if spec is None:
            return _error(404, f"no tool {'/'.join(segments[:2])}")
        if method == "POST" and not rest:
            return await self._dispatch(spec, headers, body)
        if method == "GET" and len(rest) == 2 and rest[0] in ("by-key", "by-idempotency-key"):
            return await self._status(spec, rest[0], rest[1], headers)
        if method == "POST" and len(rest) == 2 and rest[0] == "compensate" and spec.compensate:
            return await self._compensate(spec, rest[1], headers, body)
        return _error(404, "no route")

    async def _dispatch(
        self, spec: ToolSpec, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        key = headers.get("idempotency-key")
        if not key:
            return _error(
                400, "the Idempotency-Key header is required (Sluice sends it on every call)"
            )
        try:
            args = json.loads(body or b"{}")
        except ValueError:
            return _error(400, "the body must be a JSON object of the arguments")
        if not isinstance(args, dict):
            return _error(400, "the body must be a JSON object of the arguments")
        business_key = headers.get("x-sluice-business-key") or _render(spec.business_key, args)
        call = Call(
            key, headers.get("x-sluice-run-id"), headers.get("x-sluice-command-key"), business_key
        )
        record = Record(spec.name, key, _hash(args), IN_PROGRESS, business_key)
        taken = await self._take(record)
        if taken is not None:
            return taken
        arguments = dict(args)
        if _accepts(spec.function, "call"):
            arguments["call"] = call
        return await self._run(spec.name, key, spec.function, arguments, success=201)

    async def _take(self, record: Record) -> tuple[int, Any, list[tuple[bytes, bytes]]] | None:
        """Records ``record`` as in progress; or the answer a request with its key gets now."""
        existing = await anyio.to_thread.run_sync(self.store.begin, record)
        if existing is None:
            return None
        if existing.args_hash != record.args_hash:
            return _error(
                422, "this Idempotency-Key was first used with other arguments; nothing was done"
            )
        if existing.state == DONE:
            return existing.status or 200, existing.body, [(b"idempotent-replayed", b"true")]
        if existing.state == IN_DOUBT and await anyio.to_thread.run_sync(
            self.store.retake, record.tool, record.key
        ):
            return None
        return _error(409, "a request with this Idempotency-Key is in progress; ask again later")

    async def _run(
        self,
        tool: str,
        key: str,
        function: Callable[..., Any],
        arguments: dict[str, Any],
        *,
        success: int,
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        try:
            result = await _invoke(function, arguments)
        except Refused as refused:
            answer = {"error": refused.message, "details": refused.details}
            await anyio.to_thread.run_sync(
                self.store.finish, tool, key, refused.status, answer, None
            )
            return refused.status, answer, []
        except Exception as failed:
            await anyio.to_thread.run_sync(self.store.doubt, tool, key)
            return _error(500, f"{type(failed).__name__}: {failed} (the outcome is unknown)")
        result = json.loads(json.dumps(result, default=str))
        await anyio.to_thread.run_sync(
            self.store.finish, tool, key, success, result, _reference(result)
        )
        return success, result, []

    async def _status(
        self, spec: ToolSpec, by: str, value: str, headers: dict[str, str]
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        business_key = value if by == "by-key" else headers.get("x-sluice-business-key")
        idempotency_key = (
            value if by == "by-idempotency-key" else headers.get("idempotency-key", "")
        )
        if spec.status is not None:
            call = Call(
                idempotency_key,
                headers.get("x-sluice-run-id"),
                headers.get("x-sluice-command-key"),
                business_key,
            )
            offered = {
                "business_key": business_key,
                "idempotency_key": idempotency_key,
                "call": call,
            }
            try:
                found = await _invoke(spec.status, _pick(spec.status, offered))
            except Exception as failed:
                return _error(503, f"lookup failed: {type(failed).__name__}: {failed}")
            records = (
                [] if found is None else list(found) if isinstance(found, list | tuple) else [found]
            )
            return _lookup(records, durable=True)
        if by == "by-key" and business_key is not None:
            stored = await anyio.to_thread.run_sync(
                self.store.by_business_key, spec.name, business_key
            )
        else:
            one = await anyio.to_thread.run_sync(self.store.get, spec.name, idempotency_key)
            stored = [one] if one is not None else []
        if any(r.state in (IN_PROGRESS, IN_DOUBT) for r in stored):
            return _error(503, "a call with this key has an unknown outcome; ask again later")
        committed = [r.body for r in stored if r.committed]
        return _lookup(committed, durable=self.store.durable)

    async def _compensate(
        self, spec: ToolSpec, external_ref: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        assert spec.compensate is not None  # routed only when declared
        key = headers.get("idempotency-key")
        if not key:
            return _error(
                400, "the Idempotency-Key header is required (Sluice sends it on every call)"
            )
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return _error(400, 'the body must be JSON: {"args": ..., "external_ref": ...}')
        args = request.get("args") if isinstance(request, dict) else None
        scope = spec.name + "#compensate"
        record = Record(scope, key, _hash([external_ref, args]), IN_PROGRESS)
        taken = await self._take(record)
        if taken is not None:
            # A compensation still running is "not now" (retried), never "impossible".
            return (503, *taken[1:]) if taken[0] == 409 else taken
        call = Call(
            key,
            headers.get("x-sluice-run-id"),
            headers.get("x-sluice-command-key"),
            headers.get("x-sluice-business-key"),
            headers.get("x-sluice-dispatch-idempotency-key"),
        )
        offered = {"external_ref": external_ref, "args": args or {}, "call": call}
        return await self._run(
            scope, key, spec.compensate, _pick(spec.compensate, offered), success=200
        )


async def _respond(send: Send, status: int, answer: Any, extra: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(answer, default=str).encode()
    headers = [(b"content-type", b"application/json"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """A JSON Schema of the function's keyword arguments, from its annotations and defaults."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints = _hints(function)
    for name, parameter in inspect.signature(function).parameters.items():
        if name == "call" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(hints.get(name))
        properties[name] = {"type": kind} if kind else {}
        if parameter.default is parameter.empty:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not any(p.kind == p.VAR_KEYWORD for p in inspect.signature(function).parameters.values()):
        schema["additionalProperties"] = False
    return schema


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(function)
    except Exception:
        return {}


def _summary(function: Callable[..., Any]) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _accepts(function: Callable[..., Any], name: str) -> bool:
    parameters = inspect.signature(function).parameters
    return name in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _pick(function: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The offered values the function's signature asks for."""
    return {name: value for name, value in offered.items() if _accepts(function, name)}


async def _invoke(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(function):
        return await function(**arguments)
    return await anyio.to_thread.run_sync(functools.partial(function, **arguments))


def _render(template: str | None, args: dict[str, Any]) -> str | None:
    """The business key from the arguments (Sluice sends it as a header; this is for others)."""
    if template is None:
        return None

    def text(match: re.Match[str]) -> str:
        value = args.get(match.group(1))
        return json.dumps(value) if isinstance(value, bool) else str(value)

    return _PLACEHOLDER.sub(text, template)


def _hash(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _reference(result: Any) -> str | None:
    if isinstance(result, dict) and isinstance(result.get("id"), str | int):
        return str(result["id"])
    return None


def _lookup(records: list[Any], *, durable: bool) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
    """A status check's answer from the commits found."""
    if not records:
        if not durable:
            return _error(503, "not found, but this in-memory store forgets on restart: unknown")
        return _error(404, "no such effect")
    if len(records) == 1:
        return 200, records[0], []
    refs = [ref for ref in (_reference(r) for r in records) if ref is not None]
    return (
        409,
        {"error": f"{len(records)} commits", "id": refs[0] if refs else None, "refs": refs},
        [],
    )


def _error(status: int, message: str) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
    return status, {"error": message}, []

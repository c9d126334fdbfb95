"""The README's examples, run as a new user runs them: in the order the README gives them,
against one demo upstream and one `sluice dev` (conftest.py), each as written.

1. "A five-minute tour with curl": every ```sh block but the one that starts the servers, run
   by bash with real curl (wrapped to record each answer's status, headers and body), each
   answer checked against the status and fields the README's comment shows; and the prose
   claims that follow the blocks (the same call again, the same wire from another run, another
   amount, an unknown tool, a negative amount, a rolled-back run taking nothing new, the wire
   the misbehaving bank committed found by the status check, and only once).
2. The Python quickstart, twice, with the python of a virtualenv that has ./sdk/python
   installed (SLUICE_README_PYTHON, made by scripts/suites/readme.sh).
3. The TypeScript quickstart, twice, with node, against sdk/typescript as an installed package
   (built by the suite script).
4. The MCP snippet: its JSON config's command, args and env, started over stdio by the official
   MCP Python SDK, which lists the tools and calls one.

Then the demo upstream's /_stats must show exactly the effects these made, none twice.

The tests share the servers and depend on each other's effects on purpose: an example that
collides with an earlier one (the same business key, the same run and positions) fails here,
as it would for the reader. Run them in file order (pytest's default)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import REPO, SLUICE, Servers, clean_env

README = (REPO / "README.md").read_text()
# What each step made, by name, for the closing check.
DONE: dict[str, Any] = {}


def section(title: str) -> str:
    """The README's text under `## <title>`, up to the next `## ` heading."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```\n", text, re.S | re.M)


def marked(name: str, lang: str) -> str:
    """The code between `<!-- quickstart:<name> -->` markers, without its fence."""
    block = re.search(
        rf"<!-- quickstart:{name} -->\n```{lang}\n(.*?)```\n<!-- /quickstart:{name} -->", README, re.S
    )
    assert block, f"README.md has no ```{lang} block between the quickstart:{name} markers"
    return block.group(1)


def api(servers: Servers, path: str) -> Any:
    request = urllib.request.Request(
        servers.url + path, headers={"authorization": f"Bearer {servers.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def upstream_stats(servers: Servers) -> dict[str, Any]:
    with urllib.request.urlopen(f"{servers.upstream}/_stats", timeout=10) as answer:
        return json.load(answer)


def wait_ready(servers: Servers) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{servers.url}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < deadline, f"sluice dev not ready:\n{servers.log.read_text()[-3000:]}"
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------
# 1. The curl tour

# curl as the reader runs it, but each call also records its status code, headers and body.
CURL_RECORDER = r"""
_n=0
curl() {
  _n=$((_n + 1))
  local rc=0
  command curl -D "$CALLS/$_n.head" -o "$CALLS/$_n.body" -w '%{http_code}' "$@" >"$CALLS/$_n.code" || rc=$?
  echo "$rc" >"$CALLS/$_n.rc"
  return "$rc"
}
"""


@dataclass
class Answer:
    status: int
    headers: str
    body: Any  # the JSON answer, or the text when it is not JSON

    def field(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None

    def error_code(self) -> Any:
        error = self.field("error")
        return error.get("code") if isinstance(error, dict) else None


@dataclass
class Shown:
    """What the README's comment under a curl command shows of its answer: `# 201 {...}`."""

    status: int | None
    fields: dict[str, Any]  # the top-level "key":value pairs it names (strings, numbers, booleans)


@dataclass
class Block:
    text: str  # as the README shows it
    shown: list[Shown]  # one per curl command in it, in order


def shown(comment: str) -> Shown:
    status = re.match(r"\s*(\d{3})\b", comment)
    pairs = re.findall(r'"(\w+)":("[^"]*"|true|false|-?\d+)', comment)
    return Shown(
        status=int(status.group(1)) if status else None,
        fields={name: json.loads(value) for name, value in pairs},
    )


def tour_blocks() -> list[Block]:
    blocks = fenced(section("A five-minute tour with curl"), "sh")
    assert blocks and "cargo run" in blocks[0], "the tour's first block starts the servers"
    out = []
    for text in blocks[1:]:
        # A command starts with `curl`; the whole-line comments after it show its answer.
        comments: list[list[str]] = []
        for line in text.splitlines():
            if line.startswith("curl "):
                comments.append([])
            elif line.startswith("#"):
                assert comments, f"a comment before any command:\n{text}"
                comments[-1].append(line[1:])
        out.append(Block(text=text, shown=[shown("\n".join(c)) for c in comments]))
    return out


def run_curl(servers: Servers, script: str, tmp: Path) -> list[Answer]:
    """Runs a README block with bash, its addresses moved to the test's servers only."""
    dev, upstream = urlsplit(servers.url), urlsplit(servers.upstream)
    script = script.replace("localhost:8700", f"localhost:{dev.port}")
    script = script.replace("localhost:8787", f"localhost:{upstream.port}")
    calls = tmp / f"calls-{len(list(tmp.iterdir()))}"
    calls.mkdir()
    env = {
        **clean_env(),
        "SLUICE_TOKEN": servers.token,
        "AUTH": f"authorization: Bearer {servers.token}",
        "CALLS": str(calls),
    }
    ran = subprocess.run(
        ["bash", "-c", CURL_RECORDER + script], env=env, capture_output=True, text=True, timeout=90
    )
    assert ran.returncode == 0, f"bash ran the block with status {ran.returncode}:\n{script}\n{ran.stderr}"
    answers = []
    for n in range(1, len(list(calls.glob("*.code"))) + 1):
        assert (calls / f"{n}.rc").read_text().strip() == "0", f"curl failed:\n{script}\n{ran.stderr}"
        body = (calls / f"{n}.body").read_text()
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body
        answers.append(Answer(
            status=int((calls / f"{n}.code").read_text()),
            headers=(calls / f"{n}.head").read_text().lower(),
            body=parsed,
        ))
    assert answers, f"the block made no curl call:\n{script}"
    return answers


def one(answers: list[Answer]) -> Answer:
    assert len(answers) == 1, answers
    return answers[0]


def as_shown(block: Block, answers: list[Answer]) -> list[Answer]:
    """Each answer is what the block's comments show: its status and every field they name."""
    assert len(answers) == len(block.shown), f"{len(answers)} curl calls from\n{block.text}"
    for answer, expected in zip(answers, block.shown, strict=True):
        where = f"the README's block\n{block.text}\nanswered {answer.status} {answer.body}"
        if expected.status is not None:
            assert answer.status == expected.status, where
        else:
            assert 200 <= answer.status < 300, where
        for name, value in expected.fields.items():
            assert answer.field(name) == value, f"{name}: {where}"
    return answers


def variant(text: str, old: str, new: str) -> str:
    assert old in text, f"the README's block no longer holds {old!r}:\n{text}"
    return text.replace(old, new)


def test_1_the_curl_tour(servers: Servers, tmp_path: Path) -> None:
    wait_ready(servers)
    blocks = tour_blocks()
    assert len(blocks) == 6, "submit, wait, submit and wait, list, roll back, faults: update this test"
    wire, wait, mail, listing, rollback, faults = blocks

    def run(text: str) -> Answer:
        return one(run_curl(servers, text, tmp_path))

    def run_shown(block: Block) -> list[Answer]:
        return as_shown(block, run_curl(servers, block.text, tmp_path))

    [submitted] = run_shown(wire)
    assert wire.shown[0].fields.get("status") == "PENDING", "the README shows the wire PENDING"
    # The wire's business key names its beneficiary, so another beneficiary is another wire.
    assert submitted.field("business_key") == "acc-1:b-9:125000:2026-11-22", submitted
    run_shown(wait)
    [mailed] = run_shown(mail)

    # "Submit the same call again: 200 and the same command, with "existing": "command_key""
    for block, first in ((wire, submitted), (mail, mailed)):
        again = run(block.text)
        assert again.status == 200, again
        assert again.field("existing") == "command_key", again
        assert again.field("command_key") == first.field("command_key"), again
        assert "sluice-existing: command_key" in again.headers, again.headers
    # "the same wire from another run (...: its business key) is 200 with r-abc's command and
    # "existing": "business_key" (also the Sluice-Existing header), and nothing new is recorded"
    other = run(variant(wire.text, '"run_id": "r-abc"', '"run_id": "r-other"'))
    assert other.status == 200, other
    assert other.field("existing") == "business_key", other
    assert (other.field("run_id"), other.field("command_key")) == ("r-abc", submitted.field("command_key"))
    assert "sluice-existing: business_key" in other.headers, other.headers
    # "The same key with another amount: 409 argument_drift"
    drift = run(variant(wire.text, "125000", "125001"))
    assert (drift.status, drift.error_code()) == (409, "argument_drift"), drift
    # "An unknown tool: 404"
    unknown = run(variant(wire.text, '"tool": "payments/wire"', '"tool": "payments/nope"'))
    assert unknown.status == 404, unknown
    # "An amount of -5: 422 naming /args/amount_minor"
    negative = run(variant(wire.text, "125000", "-5"))
    assert negative.status == 422 and "/args/amount_minor" in json.dumps(negative.body), negative
    assert len(api(servers, "/v1/runs/r-abc/effects")["effects"]) == 2, "nothing new was recorded"
    assert api(servers, "/v1/runs/r-other/effects")["effects"] == [], "nothing new was recorded"

    # List a run: both effects are CONFIRMED by now.
    [listed] = run_shown(listing)
    assert [e["status"] for e in listed.field("effects")] == ["CONFIRMED", "CONFIRMED"], listed

    # Roll it back; "the run then takes no new effects: 409 run_rolled_back".
    run_shown(rollback)
    late = run(variant(mail.text, '"decision": 4', '"decision": 9'))
    assert (late.status, late.error_code()) == (409, "run_rolled_back"), late

    # The bank commits and answers 500: the wire goes UNKNOWN, then CONFIRMED from the status
    # check, "with exactly one wire at the bank"; then the bank behaves again.
    _, _, stats, _ = run_shown(faults)
    assert stats.body["standing_wires_by_key"]["acc-1:b-4:9900:2026-11-22"] == 1, stats.body
    assert stats.body["faults"]["commit_then_5xx"] == 1, stats.body
    entries = api(servers, "/v1/runs/r-def/audit")["entries"]
    went = [(e["to"], e["reason"]) for e in entries if e["to"] in ("UNKNOWN", "CONFIRMED")]
    assert [to for to, _ in went[:2]] == ["UNKNOWN", "CONFIRMED"], entries
    assert went[1][1] == "status check: present", entries
    DONE["tour"] = True


# ------------------------------------------------------------------------------------------
# 2. and 3. The quickstarts, each run twice, as written, with the printed SLUICE_URL and token


def quickstart_env(servers: Servers) -> dict[str, str]:
    return {**clean_env(), "SLUICE_URL": servers.url, "SLUICE_TOKEN": servers.token}


def run_twice(command: list[str], cwd: Path, servers: Servers) -> str:
    runs = [
        subprocess.run(command, cwd=cwd, env=quickstart_env(servers), capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    for n, ran in enumerate(runs, 1):
        assert ran.returncode == 0, f"run {n} of {command} failed:\n{ran.stdout}\n{ran.stderr}"
    assert runs[0].stdout == runs[1].stdout, "the second run gets the first one's results"
    return runs[0].stdout


def test_2_the_python_quickstart(servers: Servers, tmp_path: Path) -> None:
    python = os.environ.get("SLUICE_README_PYTHON")
    assert python, "SLUICE_README_PYTHON: a python with ./sdk/python installed (scripts/suites/readme.sh)"
    script = tmp_path / "quickstart.py"
    script.write_text(marked("python", "python"))
    out = run_twice([python, str(script)], tmp_path, servers)
    # A wire and an email of their own: the tour's are w-1, w-2 and m-1.
    assert out == "w-3 m-2\n", out
    DONE["python"] = out


def test_3_the_typescript_quickstart(servers: Servers, tmp_path: Path) -> None:
    package = REPO / "sdk" / "typescript"
    assert (package / "dist" / "index.js").exists(), "sdk/typescript is built (scripts/suites/readme.sh)"
    # The package as an agent project installs it (`npm install ./sdk/typescript` links it).
    (tmp_path / "node_modules" / "@sluice").mkdir(parents=True)
    (tmp_path / "node_modules" / "@sluice" / "client").symlink_to(package, target_is_directory=True)
    (tmp_path / "quickstart.mjs").write_text(marked("typescript", "js"))
    out = run_twice(["node", "quickstart.mjs"], tmp_path, servers)
    assert out == "m-3 t-1\n", out
    DONE["typescript"] = out


# ------------------------------------------------------------------------------------------
# 4. The MCP snippet


def test_4_the_mcp_snippet(servers: Servers) -> None:
    blocks = fenced(section("MCP agents: `sluice mcp`"), "json")
    assert len(blocks) == 1, blocks
    config = json.loads(blocks[0])["mcpServers"]["sluice"]
    assert config["command"] == "sluice", config
    assert "http://127.0.0.1:8700" in config["args"], config
    args = [servers.url if arg == "http://127.0.0.1:8700" else arg for arg in config["args"]]
    # `sluice dev` prints one token (an admin's); the README's config takes any token it has.
    env = {**config["env"], "SLUICE_TOKEN": servers.token}
    params = StdioServerParameters(command=SLUICE, args=args, env=env)

    async def session() -> tuple[list[str], Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = [tool.name for tool in (await mcp.list_tools()).tools]
            called = await mcp.call_tool(
                "email__send", {"to": "ops@example.com", "subject": "from an MCP agent", "body": "hello"}
            )
            return tools, called

    tools, called = anyio.run(session)
    assert {"payments__wire", "email__send", "tickets__create", "search__lookup"} <= set(tools), tools
    assert not (getattr(called, "isError", None) or getattr(called, "is_error", None)), called
    done = getattr(called, "structuredContent", None) or getattr(called, "structured_content", None)
    assert done and done["status"] == "CONFIRMED" and done["external_ref"] == "m-4", called
    # It is an effect of Sluice's: recorded in the session's run, once.
    effects = api(servers, f"/v1/runs/{done['run_id']}/effects")["effects"]
    assert [(e["tool"], e["status"], e["external_ref"]) for e in effects] == [
        ("email/send", "CONFIRMED", "m-4")
    ], effects
    DONE["mcp"] = done["run_id"]


# ------------------------------------------------------------------------------------------
# Then: exactly the effects the examples made, none twice


def test_5_the_upstream_holds_exactly_what_the_examples_made(servers: Servers) -> None:
    assert set(DONE) == {"tour", "python", "typescript", "mcp"}, f"steps that succeeded: {sorted(DONE)}"
    # The tour's rollback reverses its wire; the email cannot be unsent (NO_COMPENSATION).
    deadline = time.monotonic() + 30
    while True:
        stats = upstream_stats(servers)
        effects = api(servers, "/v1/effects?limit=100")["effects"]
        settled = {(e["run_id"], e["tool"]): e["status"] for e in effects}
        if settled.get(("r-abc", "payments/wire")) == "COMPENSATED" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert settled == {
        ("r-abc", "payments/wire"): "COMPENSATED",
        ("r-abc", "email/send"): "NO_COMPENSATION",
        ("r-def", "payments/wire"): "CONFIRMED",
        ("quickstart-py-1", "payments/wire"): "CONFIRMED",
        ("quickstart-py-1", "email/send"): "CONFIRMED",
        ("quickstart-ts-1", "email/send"): "CONFIRMED",
        ("quickstart-ts-1", "tickets/create"): "CONFIRMED",
        (DONE["mcp"], "email/send"): "CONFIRMED",
    }, settled
    assert len(effects) == 8, effects
    made = {k: stats[k] for k in ("wires", "wires_reversed", "emails", "tickets", "tickets_closed", "searches")}
    assert made == {
        "wires": 3,  # the tour's two (b-9, b-4) and the Python quickstart's (b-7)
        "wires_reversed": 1,  # the tour's, by its rollback
        "emails": 4,  # the tour, the two quickstarts, the MCP call
        "tickets": 1,  # the TypeScript quickstart's
        "tickets_closed": 0,
        "searches": 0,
    }, stats
    # One wire standing per business key at most: the tour's first reversed, the others booked.
    assert stats["standing_wires_by_key"] == {
        "acc-1:b-9:125000:2026-11-22": 0,
        "acc-1:b-4:9900:2026-11-22": 1,
        "acc-1:b-7:125000:2026-11-22": 1,
    }, stats
    # The one fault the tour asked for, and none after it: the bank behaved for the quickstarts.
    assert {k: v for k, v in stats["faults"].items() if v} == {"commit_then_5xx": 1}, stats

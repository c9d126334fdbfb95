#!/usr/bin/env python3
"""The shape check: the services hold no rule of their own (docs/architecture.md, "The shape
check").

Every service job reads what it needs, asks the core for a plan, and carries out the core's
actions through the runtime's one publish path. A service that matches on a command's status,
does time arithmetic about a command or publishes on the bus by itself holds a rule the core
cannot test. This script reads the services' source (services/{producer,dispatcher,reconciler,
compensator}/src, test code left out) and fails on each such line, printing file:line and the
rule.

The rules (each precise enough to leave presentation alone: parsing a `?status=` filter,
rendering a status as text, sorting a listing):

  status-compare   a command status compared with a named status:
                   `x.status() == CommandStatus::Blocked`, `to == Some(CommandStatus::Blocked)`
                   (comparing with a status the caller chose, `c.status() == wanted`, is a filter)
  status-matches   `matches!(x.status(), CommandStatus::… )`
  status-arm       a `match` arm on named statuses: `CommandStatus::Unknown => …` (also under a
                   `use CommandStatus as S` alias)
  time-arithmetic  `.plus_millis(`, `.minus_millis(`, `.millis_since(` on a timestamp
  time-compare     a timestamp of a command's state tested against a time:
                   `state.due_at.is_some_and(…)`, `state.flow_slot <= …`, or anything compared
                   with `now` / `clock.now()` (`slot <= now`)
  bus-publish      a message put on the bus by the service itself (`bus.publish(`,
                   `.publish_admitted(`) or built by it (`dispatch_request(`,
                   `reconcile_request(`, `compensate_request(`, `run_compensate_request(`):
                   the runtime's `Context::carry_out` and its table `request_for` do that

Test code is not read: an item under `#[cfg(test)]`, and the files of a `#[cfg(test)] mod x;`.
Comments and string literals are blanked before matching.

What remains today is listed in scripts/job-shape-allow.txt, one entry a line:

    path:text # why

`path` is relative to the repository; an entry allows every finding in that file whose line
contains `text`. An entry that allows nothing fails the check too, so the list only shrinks.

Usage:
    scripts/check-job-shape.py                 # check the repository this script is in
    scripts/check-job-shape.py --root DIR      # check another tree (DIR/services/...)
    scripts/check-job-shape.py --allow FILE    # another allow-list ("" for none)
    scripts/check-job-shape.py --self-test     # check that the check fails where it must
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass

SERVICES = ("producer", "dispatcher", "reconciler", "compensator")
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str


def blank(source: str) -> str:
    """The source with comments and the contents of string and char literals replaced by
    spaces; newlines are kept, so offsets and line numbers stay."""
    out = list(source)
    i, n = 0, len(source)

    def wipe(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            wipe(i, end)
            i = end
        elif source.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if source.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif source.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', source[i:i + 260]) and not (
            i and (source[i - 1].isalnum() or source[i - 1] == "_")
        ):
            hashes = re.match(r"r(#*)\"", source[i:]).group(1)
            close = '"' + hashes
            start = i + 2 + len(hashes)
            end = source.find(close, start)
            end = n if end < 0 else end + len(close)
            wipe(start, end - len(close))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the first is wiped.
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", source[i:i + 12])
            if m:
                wipe(i + 1, i + len(m.group(0)) - 1)
                i += len(m.group(0))
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def without_tests(code: str) -> tuple[str, list[str]]:
    """`code` (already blanked) with every `#[cfg(test)]` item blanked, and the names of the
    `#[cfg(test)] mod x;` declared in it (their files are test code)."""
    out = list(code)
    test_mods = []
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        i = m.end()
        brace, semi = code.find("{", i), code.find(";", i)
        if semi >= 0 and (brace < 0 or semi < brace):
            decl = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code[i:semi + 1])
            if decl:
                test_mods.append(decl.group(1))
            end = semi + 1
        elif brace >= 0:
            depth, j = 0, brace
            while j < len(code):
                if code[j] == "{":
                    depth += 1
                elif code[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            end = j + 1
        else:
            end = len(code)
        for k in range(m.start(), min(end, len(code))):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out), test_mods


STATUS = r"(?:CommandStatus|{alias})::[A-Z]\w*"


def rules(code: str) -> list[tuple[str, re.Pattern]]:
    aliases = re.findall(r"CommandStatus\s+as\s+(\w+)", code)
    status = STATUS.format(alias="|".join(map(re.escape, aliases)) or "CommandStatus")
    ws = r"\s*"
    return [
        (
            "status-compare",
            re.compile(
                rf"(?:==|!=){ws}(?:Some\({ws})?{status}"
                rf"|{status}{ws}\)?{ws}(?:==|!=)"
            ),
        ),
        (
            "status-matches",
            re.compile(rf"matches!{ws}\([^,;]*\bstatus\b[^,;]*,{ws}{status}"),
        ),
        (
            "status-arm",
            re.compile(rf"{status}(?:{ws}\|{ws}{status})*{ws}(?:=>|if\b)"),
        ),
        (
            "time-arithmetic",
            re.compile(r"\.(?:plus_millis|minus_millis|millis_since)\s*\("),
        ),
        (
            "time-compare",
            re.compile(
                r"\bstate\s*\.\s*\w+_(?:at|until|by|before|slot)\b\s*"
                r"(?:\.\s*(?:is_some_and|is_none_or|map_or)\b|<=?|>=?)"
                r"|\bflow_slot\b\s*(?:\.\s*(?:is_some_and|is_none_or|map_or)\b|<=?|>=?)"
                r"|(?<![-=])(?:<=|>=|<|>)(?![=>])\s*[\w.]*\bstate\s*\.\s*\w+_(?:at|until|by|before|slot)\b"
                r"|(?<![-=])(?:<=|>=|<|>)(?![=>])\s*(?:[\w.]+\.)?now\b"
                r"|\bnow\b(?:\s*\(\s*\))?\s*(?:<=|>=|<|>)(?![=>])"
            ),
        ),
        (
            "bus-publish",
            re.compile(
                r"\bbus\s*\.\s*publish\w*\s*\("
                r"|\.\s*publish_admitted\s*\("
                r"|\b(?:dispatch_request|reconcile_request|compensate_request"
                r"|run_compensate_request)\s*\("
            ),
        ),
    ]


def module_dir(path: str) -> str:
    """Where the files of the modules `path` declares live."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem in ("lib", "main", "mod"):
        return os.path.dirname(path)
    return os.path.join(os.path.dirname(path), stem)


def scan(root: str) -> list[Finding]:
    files = []
    for service in SERVICES:
        src = os.path.join(root, "services", service, "src")
        for dirpath, _, names in os.walk(src):
            files += [os.path.join(dirpath, name) for name in names if name.endswith(".rs")]
    files.sort()
    skipped: set[str] = set()
    codes = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        code, test_mods = without_tests(blank(source))
        codes[path] = (source, code)
        for name in test_mods:
            base = os.path.join(module_dir(path), name)
            skipped.add(base + ".rs")
            skipped.add(base + os.sep)
    findings = []
    for path in files:
        if path in skipped or any(path.startswith(d) for d in skipped if d.endswith(os.sep)):
            continue
        source, code = codes[path]
        lines = source.split("\n")
        broken: dict[int, list[str]] = {}
        for rule, pattern in rules(code):
            for m in pattern.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                if rule not in broken.setdefault(line, []):
                    broken[line].append(rule)
        findings += [
            Finding(os.path.relpath(path, root), line, ", ".join(names), lines[line - 1].strip())
            for line, names in broken.items()
        ]
    findings.sort(key=lambda f: (f.path, f.line))
    return findings


@dataclass
class Entry:
    number: int
    path: str
    text: str
    used: bool = False


def read_allow(path: str | None) -> list[Entry]:
    if not path:
        return []
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split(" # ", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            file, sep, text = line.partition(":")
            if not sep or not text.strip():
                raise SystemExit(f"{path}:{number}: not `path:text # why`: {raw.rstrip()}")
            entries.append(Entry(number, file.strip(), text.strip()))
    return entries


def check(root: str, allow: str | None, out=sys.stdout) -> int:
    entries = read_allow(allow)
    failures = 0
    findings = scan(root)
    allowed = 0
    for finding in findings:
        matched = [e for e in entries if e.path == finding.path and e.text in finding.text]
        for entry in matched:
            entry.used = True
        if matched:
            allowed += 1
            continue
        failures += 1
        print(f"{finding.path}:{finding.line}: {finding.rule}: {finding.text}", file=out)
    for entry in entries:
        if not entry.used:
            failures += 1
            print(
                f"{allow}:{entry.number}: allows nothing any more (take it out): "
                f"{entry.path}:{entry.text}",
                file=out,
            )
    print(
        f"job shape: {len(findings)} finding(s), {allowed} allowed by the list, "
        f"{failures} failure(s)",
        file=out,
    )
    return 1 if failures else 0


VIOLATING = """\
//! A service that decides by itself; each expect comment names the rules its line breaks.
use sluice_core::command::{Command, CommandStatus as S};

pub fn decide(command: &Command, now: Timestamp) -> bool {
    // CommandStatus::Pending => in a comment is not code
    let text = "x.status() == CommandStatus::Leased";
    if command.status() == CommandStatus::Blocked { // expect: status-compare
        return false;
    }
    let busy = matches!(command.status(), CommandStatus::Leased | S::Unknown); // expect: status-matches
    let due = command.state.due_at.is_some_and(|due| due <= now); // expect: time-compare
    match command.status() {
        S::Pending | S::Leased => true, // expect: status-arm
        _ => due || command.created_at.plus_millis(5) > now, // expect: time-arithmetic time-compare
    }
}

pub async fn send(ctx: &Context, command: &Command) {
    let request = dispatch_request(command, Cause::Reserved, None); // expect: bus-publish
    ctx.bus // expect: bus-publish
        .publish(Topic::Requested, "k", request.payload, request.headers)
        .await;
}

#[cfg(test)]
mod tests {
    fn in_a_test(c: &Command) -> bool {
        c.status() == CommandStatus::Blocked
    }
}
"""

CLEAN = """\
//! A service that asks the core and renders what it is told.
pub fn listed(commands: &[Command], wanted: Option<CommandStatus>) -> Vec<&Command> {
    let mut listed: Vec<_> = commands
        .iter()
        .filter(|c| wanted.is_none_or(|s| c.status() == s))
        .collect();
    listed.sort_by_key(|c| c.state.due_at);
    listed
}

pub fn label(status: CommandStatus) -> &'static str {
    status.as_str()
}

pub fn parse(text: &str) -> Result<Vec<u8>, String> {
    Ok(Vec::<u8>::new())
}
"""


def self_test() -> int:
    """The check fails on a file that holds each rule, passes on presentation, and fails on an
    allow-list entry that allows nothing."""
    problems = []
    with tempfile.TemporaryDirectory() as root:
        src = os.path.join(root, "services", "producer", "src")
        os.makedirs(src)
        with open(os.path.join(src, "lib.rs"), "w", encoding="utf-8") as f:
            f.write(VIOLATING)
        with open(os.path.join(src, "listing.rs"), "w", encoding="utf-8") as f:
            f.write(CLEAN)
        found = {
            (f.line, rule)
            for f in scan(root)
            if f.path.endswith("lib.rs")
            for rule in f.rule.split(", ")
        }
        expected = {
            (number, rule)
            for number, line in enumerate(VIOLATING.split("\n"), 1)
            for rule in line.partition("// expect:")[2].split()
        }
        if found != expected:
            problems.append(f"findings {sorted(found)}, expected {sorted(expected)}")
        clean = [f for f in scan(root) if f.path.endswith("listing.rs")]
        if clean:
            problems.append(f"presentation flagged: {clean}")
        sink = open(os.devnull, "w", encoding="utf-8")
        if check(root, None, sink) == 0:
            problems.append("the violating file passed the check")
        allow = os.path.join(root, "allow.txt")
        with open(allow, "w", encoding="utf-8") as f:
            for line in sorted({line for line, _ in expected}):
                text = VIOLATING.split("\n")[line - 1].partition("//")[0].strip()
                f.write(f"services/producer/src/lib.rs:{text} # the self-test's\n")
        if check(root, allow, sink) != 0:
            problems.append("a fully allowed tree failed the check")
        with open(allow, "a", encoding="utf-8") as f:
            f.write("services/producer/src/lib.rs:no such line # stale\n")
        if check(root, allow, sink) == 0:
            problems.append("a stale allow-list entry passed the check")
        sink.close()
    for problem in problems:
        print(f"self-test: {problem}")
    print("job shape self-test: " + ("failed" if problems else "passed"))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(HERE))
    parser.add_argument("--allow", default=None)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    allow = args.allow
    if allow is None:
        allow = os.path.join(args.root, "scripts", "job-shape-allow.txt")
        if not os.path.exists(allow):
            allow = None
    return check(args.root, allow or None)


if __name__ == "__main__":
    sys.exit(main())

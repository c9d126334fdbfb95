#!/usr/bin/env python3
"""Every name a page puts in backticks exists in the repository (default: docs/architecture.md).

    tests/docs/check_names.py [--verbose] [PAGE.md ...]

The page is read as prose: fenced code blocks are left out (they are examples and diagrams),
and each inline code span (`...`, which may run over a line break) is sorted by the first of
these rules that fits it, in this order:

  rust-path    `Context::carry_out`, `Event::Claim { job: Look, hold_ms }`,
               `ShardStore::due_in(now, …)`, `sluice_core::machine::apply`: a Rust path, with
               call arguments or a pattern after it. Each segment but a crate name (`sluice_core`,
               `crate`, `self`, `super`, `std`) must be an item defined in the workspace's `.rs`
               files: fn, struct, enum, trait, type, const, static, mod (a `mod` line or a file),
               macro, an enum's variant or a struct's or variant's field.
  rust-call    `apply(state, rules, event, now) -> Result<Step, Refusal>`, `assign()`: a snake_case
               fn, called; it must be defined (as above), or be a dependency's or the standard
               library's that the code calls (`name(` occurs in the .rs files: `min(…)`).
  rust-type    `Action`, `Claim { job, hold_ms }`, `Apply(event)`, `Arc<dyn Ledger>`: a CamelCase
               name, alone, with a pattern, or with type parameters. Every CamelCase name in it
               must be defined, unless it is the standard library's or an HTTP header's
               (STANDARD_NAMES below: `Debug`, `Ok`, `Arc`, `Authorization`, `Location`, …).
  sluice-name  `sluice-core`, `sluice_ledger_cql`, `sluice_transitions_total{tool, from, to}`,
               `sluice-dlq-reason`: a workspace package (or one of its binaries), else a metric
               (its labels left out), header or group name that must occur verbatim in the
               code, the configuration or the schemas.
  path         `shared/core`, `services/producer/src/auth.rs`: a path whose first segment is a
               top-level entry of the repository must exist from there; `writer/ops.rs`,
               `ledger-cql/src/ledger/`: any other path naming a file (it has an extension) or
               a directory (it ends with `/`) must be the end of a tracked file's path or
               directory. Other slashed words (`payments/wire`, `application/json`) are skipped.
  file         `classify.rs`, `build.rs`, `deploy.toml`: a file name with a known extension; a
               tracked file of that name must exist somewhere in the repository.
  constant     `POINTS`, `LONG_VERSION`, `FAILPOINTS`, `OTEL_SERVICE_NAME`: SCREAMING_CASE; it must
               occur as a word in the workspace's `.rs` files (a const, an env variable it reads,
               a status it writes).
  config-key   `bus.kafka.group_prefix`, `auth.tokens[].tenants`: dotted snake_case; each segment
               must occur as a word in the code, the configuration or the schemas (`.rs`,
               `.toml`, `.yaml`, `.yml`, `.json`, `.cql`).
  word         `claimed_until`, `carry_out`, `absent`: one snake_case word (a field, a config key,
               a JSON field, a value, a fn named without its parentheses); it must occur as a
               word there too.
  skipped      anything else is not a name this check can look up, and is counted, not checked:
               spans with a space that fit no rule above (shell commands, HTTP requests,
               `Prefer: wait=30`, TOML lines), HTTP routes (`/v1/effects`), placeholders and
               templates (`<run_id>/<command_key>`, `${name}`), header names (`Retry-After`),
               tool names and keys (`payments/wire`, `d-3/payments/wire/0`), TOML tables
               (`[[rule]]`), CLI flags and values with punctuation.

Prints one line per name that does not exist (page:line: `span`: why), then the count per
rule, and exits 1 if any name is missing. Standard library only.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Names from outside the workspace that a page may name in a rust-type span: the standard
# library's and common traits', and HTTP header names written as one CamelCase word.
STANDARD_NAMES = {
    "Arc", "Box", "Clone", "Debug", "Default", "Deserialize", "Display", "Err", "Error",
    "From", "Future", "HashMap", "Into", "Mutex", "None", "Ok", "Option", "Rc", "Result",
    "RwLock", "Send", "Serialize", "Some", "String", "Sync", "Vec", "Instant", "Duration",
    "SystemTime", "Stream", "Sink",
    # the browser's API, named where the console's choices are explained
    "EventSource",
    # HTTP headers
    "Accept", "Authorization", "Host", "Location", "Origin", "Prefer", "Referer",
}
CRATE_ROOTS = {"crate", "self", "super", "std", "core", "alloc", "tokio", "serde"}
KNOWN_EXTENSIONS = ("rs", "toml", "md", "sh", "py", "yaml", "yml", "json", "cql", "sql", "ts", "js", "html", "css", "go")
CONFIG_EXTENSIONS = (".rs", ".toml", ".yaml", ".yml", ".json", ".cql")

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
RUST_PATH = re.compile(rf"^(?P<path>{IDENT}(?:::{IDENT})+)!?(?:\(.*\)|\s*\{{.*\}}|\s*->.*)?$", re.S)
RUST_CALL = re.compile(rf"^(?P<name>[a-z_][a-z0-9_]*)\(.*\)(?:\s*->.*)?$", re.S)
RUST_TYPE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(?:\s*\{.*\}|\(.*\)|<.*>)?$", re.S)
CRATE = re.compile(r"^(?P<name>sluice(?:[-_][a-z0-9]+)*)(?:\{[a-z_, ]*\})?$")
PATH = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/$|^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+$")
FILE = re.compile(rf"^[A-Za-z0-9_.-]+\.(?:{'|'.join(KNOWN_EXTENSIONS)})$")
CONSTANT = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")
CONFIG_KEY = re.compile(r"^[a-z_][a-z0-9_]*(?:\[\])?(?:\.[a-z_][a-z0-9_]*(?:\[\])?)+$")
WORD = re.compile(r"^[a-z_][a-z0-9_]*$")

ITEM = re.compile(rf"\b(?:fn|struct|enum|trait|type|const|static|mod|union)\s+(?P<name>{IDENT})")
MACRO = re.compile(rf"\bmacro_rules!\s*(?P<name>{IDENT})")
FIELD = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?(?P<name>[a-z_][a-z0-9_]*)\s*:(?!:)")
VARIANT = re.compile(rf"^\s*(?P<name>[A-Z][A-Za-z0-9_]*)\s*(?:\{{|\(|,|=|$)")


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *patterns], capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()]


def strip_comments_and_strings(line: str) -> str:
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0]


def rust_items(files: list[Path]) -> set[str]:
    """Names defined in the workspace: items, macros, enum variants and fields, module files."""
    names: set[str] = set()
    for path in files:
        names.add(path.stem if path.stem not in ("mod", "lib", "main") else path.parent.name)
        text = path.read_text(errors="replace")
        names.update(m.group("name") for m in ITEM.finditer(text))
        names.update(m.group("name") for m in MACRO.finditer(text))
        # Variants and fields: lines at depth one inside an enum's or a struct's braces, and
        # fields inside a variant's braces (depth two of an enum).
        kind, depth = None, 0
        for raw in text.splitlines():
            line = strip_comments_and_strings(raw)
            if kind is None:
                opened = re.search(r"\b(enum|struct)\s+[A-Za-z_]\w*[^;{]*\{", line)
                if opened and "(" not in line[: opened.start()].split("=")[-1]:
                    kind = opened.group(1)
                    depth = line[opened.end() - 1 :].count("{") - line[opened.end() - 1 :].count("}")
                    if depth <= 0:
                        kind = None
                continue
            if depth == 1 and kind == "enum" and (m := VARIANT.match(line)):
                names.add(m.group("name"))
            if (depth == 1 and kind == "struct") or (depth == 2 and kind == "enum"):
                if m := FIELD.match(line):
                    names.add(m.group("name"))
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                kind = None
    return names


def words_in(files: list[Path]) -> set[str]:
    words: set[str] = set()
    for path in files:
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(errors="replace")))
    return words


def crates() -> set[str]:
    names = set()
    for manifest in tracked("*Cargo.toml"):
        names.update(re.findall(r'^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M))
    return {n.replace("_", "-") for n in names}


def code_spans(page: Path) -> list[tuple[int, str]]:
    """Inline code spans outside fenced blocks, with the line each starts on."""
    lines = page.read_text().split("\n")
    prose: list[str] = []
    fence = None
    for line in lines:
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            prose.append("")
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            prose.append("")
        else:
            prose.append(line)
    text = "\n".join(prose)
    spans = []
    for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.S):
        body = m.group(2)
        if "\n\n" in body:
            continue  # an unclosed backtick: no span across paragraphs
        spans.append((text.count("\n", 0, m.start()) + 1, " ".join(body.split())))
    return spans


class Checker:
    def __init__(self) -> None:
        rs = [p for p in tracked("*.rs") if "/node_modules/" not in str(p)]
        self.items = rust_items(rs)
        self.rust_words = words_in(rs)
        self.config_words = words_in(
            [p for p in tracked(*(f"*{e}" for e in CONFIG_EXTENSIONS)) if "/node_modules/" not in str(p)]
        )
        self.crates = crates()
        every = tracked()
        self.files = {p.name for p in every}
        # Every tracked file's path and every directory above it, each ending in "/".
        self.paths = {"/" + str(p.relative_to(ROOT)) for p in every}
        self.paths |= {"/" + str(d.relative_to(ROOT)) + "/" for p in every for d in p.parents if d != ROOT and ROOT in d.parents}
        self.rust_text = "\n".join(p.read_text(errors="replace") for p in rs)
        self.config_text = "\n".join(
            p.read_text(errors="replace") for p in tracked(*(f"*{e}" for e in CONFIG_EXTENSIONS)) if "/node_modules/" not in str(p)
        )
        self.top = {p.name for p in ROOT.iterdir()}
        self.crate_dirs = {
            p.name: p for base in ("shared", "services") for p in (ROOT / base).iterdir() if p.is_dir()
        }

    def defined(self, name: str) -> bool:
        return name in self.items or name in STANDARD_NAMES

    def check(self, span: str) -> tuple[str, str | None]:
        """The rule the span falls under, and why it fails (None: it exists)."""
        if m := RUST_PATH.match(span):
            segments = m.group("path").split("::")
            for i, segment in enumerate(segments):
                if i == 0 and (segment in CRATE_ROOTS or segment.replace("_", "-") in self.crates):
                    continue
                if not self.defined(segment):
                    return "rust-path", f"no item named `{segment}` in the workspace's .rs files"
            return "rust-path", None
        if m := RUST_CALL.match(span):
            name = m.group("name")
            ok = self.defined(name) or f"{name}(" in self.rust_text
            return "rust-call", None if ok else f"no fn named `{name}` in the workspace, nor called there"
        if RUST_TYPE.match(span):
            head = re.split(r"[\s({<]", span, maxsplit=1)[0]
            inner = re.findall(r"\b[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b", span) if "<" in span else [head]
            missing = [n for n in inner if not self.defined(n)]
            return "rust-type", (f"no item named `{missing[0]}` in the workspace" if missing else None)
        if m := CRATE.match(span):
            name = m.group("name")
            ok = name.replace("_", "-") in self.crates or name in self.config_text
            return "sluice-name", None if ok else "no workspace package of that name, nor a name the code uses"
        if PATH.match(span):
            first = span.split("/", 1)[0]
            if first in self.top:
                return "path", None if (ROOT / span).exists() else "no such file or directory"
            if span.endswith("/") or FILE.match(span.rsplit("/", 1)[1]):
                tail = "/" + span
                ok = any(p.endswith(tail) for p in self.paths)
                return "path", None if ok else "no tracked file or directory ends with this path"
            return "skipped", None
        if FILE.match(span):
            return "file", None if span in self.files else "no tracked file of that name"
        if CONSTANT.match(span):
            ok = span in self.rust_words
            return "constant", None if ok else "does not occur in the workspace's .rs files"
        if CONFIG_KEY.match(span):
            missing = [s for s in re.split(r"\[\]\.?|\.", span) if s and s not in self.config_words]
            return "config-key", (f"`{missing[0]}` occurs nowhere in the code or configuration" if missing else None)
        if WORD.match(span):
            ok = span in self.config_words
            return "word", None if ok else "occurs nowhere in the code, the configuration or the schemas"
        return "skipped", None


def main(argv: list[str]) -> int:
    verbose = "--verbose" in argv
    pages = [Path(a) for a in argv if a != "--verbose"] or [ROOT / "docs" / "architecture.md"]
    checker = Checker()
    counts: Counter[str] = Counter()
    failures = 0
    for page in pages:
        shown = page.resolve().relative_to(ROOT) if page.resolve().is_relative_to(ROOT) else page
        for line, span in code_spans(page):
            rule, problem = checker.check(span)
            counts[rule] += 1
            if problem:
                failures += 1
                print(f"{shown}:{line}: `{span}` ({rule}): {problem}")
            elif verbose:
                print(f"{shown}:{line}: `{span}`: {rule}")
    checked = sum(n for rule, n in counts.items() if rule != "skipped")
    summary = ", ".join(f"{rule} {counts[rule]}" for rule in sorted(counts))
    print(f"names: {checked} checked, {failures} missing, {counts['skipped']} skipped ({summary})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

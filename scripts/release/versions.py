#!/usr/bin/env python3
"""The version of Sluice, and every place that repeats it.

One source of truth: `[workspace.package] version` in Cargo.toml (every crate takes it with
`version.workspace = true`). The files that must repeat it, because their tools cannot read
Cargo.toml, are listed in COPIES below.

    scripts/release/versions.py --check        # prints the version; exits 1 naming each
                                               # file that disagrees or is not SemVer
    scripts/release/versions.py --set 0.2.0    # writes a new version into all of them

`--set` does not touch CHANGELOG.md: moving [Unreleased] under the new version's heading is the
release's own edit (docs/release.md), and `--check` then wants that heading.
"""
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# SemVer 2.0.0's own regular expression (semver.org), without the optional leading "v".
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def workspace_version():
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def _regex(path, pattern):
    """A copy found by a regular expression whose group 1 is the version."""

    def read():
        m = re.search(pattern, (ROOT / path).read_text(), re.M)
        return m.group(1) if m else None

    def write(new):
        text = (ROOT / path).read_text()
        m = re.search(pattern, text, re.M)
        (ROOT / path).write_text(text[: m.start(1)] + new + text[m.end(1):])

    return read, write


def _json(path, *keys):
    def read():
        doc = json.loads((ROOT / path).read_text())
        for k in keys:
            doc = doc[k]
        return doc

    def write(new):
        doc = json.loads((ROOT / path).read_text())
        target = doc
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = new
        (ROOT / path).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")

    return read, write


# (file, what, (read, write)): each copy of the version.
COPIES = [
    ("sdk/python/pyproject.toml", "[project] version", _regex("sdk/python/pyproject.toml", r'^version = "([^"]+)"')),
    ("sdk/typescript/package.json", "version", _json("sdk/typescript/package.json", "version")),
    ("sdk/typescript/package-lock.json", "version", _json("sdk/typescript/package-lock.json", "version")),
    ("sdk/typescript/package-lock.json", 'packages[""].version', _json("sdk/typescript/package-lock.json", "packages", "", "version")),
    ("deploy/Dockerfile", "ARG SLUICE_VERSION", _regex("deploy/Dockerfile", r"^ARG SLUICE_VERSION=(\S+)")),
    ("k8s/kustomization.yaml", "images[sluice].newTag", _regex("k8s/kustomization.yaml", r"^  - name: sluice\n    newTag: (\S+)")),
]
# Optional copies: checked when the file exists (the Helm chart's appVersion).
OPTIONAL = [
    ("deploy/helm/sluice/Chart.yaml", "appVersion", _regex("deploy/helm/sluice/Chart.yaml", r'^appVersion: "?([^"\s]+)"?')),
]


def check():
    version = workspace_version()
    problems = []
    if not SEMVER.match(version):
        problems.append(f"Cargo.toml: [workspace.package] version {version!r} is not a semantic version (semver.org)")
    for path, what, (read, _) in COPIES + [c for c in OPTIONAL if (ROOT / c[0]).exists()]:
        try:
            found = read()
        except (OSError, KeyError, ValueError) as e:
            problems.append(f"{path}: {what} cannot be read: {e}")
            continue
        if found != version:
            problems.append(f"{path}: {what} is {found!r}, Cargo.toml's workspace version is {version!r}")
    changelog = (ROOT / "CHANGELOG.md").read_text()
    if not re.search(rf"^## \[{re.escape(version)}\]", changelog, re.M):
        problems.append(f"CHANGELOG.md: no `## [{version}]` section")
    return version, problems


def main(argv):
    if argv[:1] == ["--set"] and len(argv) == 2:
        new = argv[1]
        if not SEMVER.match(new):
            print(f"versions.py: {new!r} is not a semantic version (semver.org)", file=sys.stderr)
            return 2
        cargo = (ROOT / "Cargo.toml").read_text()
        old = workspace_version()
        cargo = re.sub(r'(\[workspace\.package\]\nversion = ")[^"]+(")', rf"\g<1>{new}\g<2>", cargo, count=1)
        (ROOT / "Cargo.toml").write_text(cargo)
        for path, what, (_, write) in COPIES + [c for c in OPTIONAL if (ROOT / c[0]).exists()]:
            write(new)
            print(f"{path}: {what} {old} -> {new}")
        print("Cargo.lock follows at the next cargo build; CHANGELOG.md is yours to edit (docs/release.md)")
        return 0
    if argv != ["--check"]:
        print(__doc__, file=sys.stderr)
        return 2
    version, problems = check()
    for p in problems:
        print(f"versions: {p}", file=sys.stderr)
    if problems:
        return 1
    print(version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

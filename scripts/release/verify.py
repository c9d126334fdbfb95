#!/usr/bin/env python3
"""Checks what scripts/release.sh put in a dist directory, as a user of the files would.

    verify.py --dist DIR --version V [--revision R --target T] [--sdks-only]

Runs under the release virtualenv (cyclonedx-python-lib validates the SBOM). Prints one line
per check, "ok   ..." or "FAIL ...", and last "N passed, N failed, N skipped"; exits 1 when a
check failed.
"""
import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

BINS = ["sluice", "sluice-producer", "sluice-dispatcher", "sluice-reconciler", "sluice-compensator"]
DOCS = ["LICENSE", "CHANGELOG.md", "README.md"]
# Shared libraries gcr.io/distroless/cc-debian12 provides (glibc, libgcc, libstdc++): anything
# else a binary needs would be missing in the image (deploy/Dockerfile).
DISTROLESS_CC = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
    "libresolv.so.2", "libgcc_s.so.1", "libstdc++.so.6", "libgomp.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}
# Crates every release binary links, which the SBOM must therefore list.
EXPECTED_CRATES = {"tokio", "axum", "rustls", "rdkafka", "rdkafka-sys", "scylla", "serde_json", "sluice-core"}

passed, failed = 0, 0


def ok(message):
    global passed
    passed += 1
    print(f"ok   {message}")


def fail(message):
    global failed
    failed += 1
    print(f"FAIL {message}")


def check(condition, good, bad):
    (ok if condition else fail)(good if condition else bad)
    return condition


def python_version(version):
    """The SDK's version as Python's tools spell it (PEP 440: 1.0.0-rc.1 is 1.0.0rc1)."""
    from packaging.version import Version

    return str(Version(version))


def verify_sums(dist):
    sums = dist / "SHA256SUMS"
    if not check(sums.is_file(), "SHA256SUMS is there", "no SHA256SUMS"):
        return
    listed = {}
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    files = {p.name for p in dist.iterdir() if p.is_file() and p.name != "SHA256SUMS" and not p.name.startswith(".")}
    check(set(listed) == files, f"SHA256SUMS lists exactly the {len(files)} artifacts",
          f"SHA256SUMS lists {sorted(listed)}, the directory holds {sorted(files)}")
    wrong = [n for n, d in listed.items() if (dist / n).is_file()
             and hashlib.sha256((dist / n).read_bytes()).hexdigest() != d]
    check(not wrong and listed, f"every checksum verifies ({len(listed)})", f"checksums do not verify: {wrong}")
    # The same check as a user runs it.
    r = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    check(r.returncode == 0, "sha256sum --check SHA256SUMS passes", f"sha256sum --check: {r.stdout}{r.stderr}")


def verify_tarball(path, name, members, version, revision, allowed_libs):
    if not check(path.is_file(), f"{path.name} is there", f"no {path.name}"):
        return
    with tarfile.open(path) as tar:
        infos = tar.getmembers()
        names = sorted(i.name for i in infos)
        want = sorted([name] + [f"{name}/{m}" for m in members])
        check(names == want, f"{path.name} holds {name}/ with {', '.join(members)}",
              f"{path.name} holds {names}, expected {want}")
        owners = {(i.uid, i.gid) for i in infos}
        check(owners == {(0, 0)}, f"{path.name}: files owned by 0:0", f"{path.name}: owners {owners}")
        with tempfile.TemporaryDirectory() as tmp:
            tar.extractall(tmp, filter="data")
            for member in members:
                file = Path(tmp, name, member)
                if member in DOCS:
                    continue
                mode = file.stat().st_mode & 0o777
                check(mode == 0o755, f"{member}: mode 0755", f"{member}: mode {mode:o}")
                r = subprocess.run([str(file), "--version"], capture_output=True, text=True, timeout=60)
                want_line = f"{member} {version} (commit {revision})"
                check(r.returncode == 0 and r.stdout.strip() == want_line,
                      f"{member} --version: {want_line}",
                      f"{member} --version printed {r.stdout.strip()!r} (exit {r.returncode}, {r.stderr.strip()}), expected {want_line!r}")
                r = subprocess.run(["readelf", "--dynamic", "--wide", str(file)], capture_output=True, text=True)
                needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout))
                extra = needed - allowed_libs
                check(r.returncode == 0 and not extra,
                      f"{member} needs only libraries distroless/cc has: {', '.join(sorted(needed))}",
                      f"{member} needs {sorted(extra)}, which gcr.io/distroless/cc-debian12 does not have"
                      if r.returncode == 0 else f"readelf failed on {member}: {r.stderr}")
            for doc in (m for m in members if m in DOCS):
                check(Path(tmp, name, doc).read_bytes() == Path(doc).read_bytes(),
                      f"{path.name}: {doc} is the repository's", f"{path.name}: {doc} differs from the repository's")


def verify_sbom(path, version, revision):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    if not check(path.is_file(), f"{path.name} is there", f"no SBOM {path.name}"):
        return
    text = path.read_text()
    doc = json.loads(text)
    spec = doc.get("specVersion")
    schema = {"1.4": SchemaVersion.V1_4, "1.5": SchemaVersion.V1_5, "1.6": SchemaVersion.V1_6}.get(spec)
    if not check(doc.get("bomFormat") == "CycloneDX" and schema, f"{path.name}: CycloneDX {spec}",
                 f"{path.name}: bomFormat {doc.get('bomFormat')!r}, specVersion {spec!r}"):
        return
    error = JsonStrictValidator(schema).validate_str(text)
    check(error is None, f"{path.name} is valid against the CycloneDX {spec} JSON schema (cyclonedx-python-lib)",
          f"{path.name} is not valid CycloneDX {spec}: {error}")
    top = doc.get("metadata", {}).get("component", {})
    check(top.get("name") == "sluice" and top.get("version") == version,
          f"{path.name}: describes sluice {version}",
          f"{path.name}: metadata.component is {top.get('name')} {top.get('version')}")
    props = {p.get("name"): p.get("value") for p in doc.get("metadata", {}).get("properties", [])}
    check(props.get("sluice:revision") == revision, f"{path.name}: names revision {revision}",
          f"{path.name}: revision property {props.get('sluice:revision')!r}")
    components = doc.get("components", [])
    names = {c.get("name") for c in components}
    missing = EXPECTED_CRATES - names
    check(len(components) > 200 and not missing,
          f"{path.name}: {len(components)} components, among them {', '.join(sorted(EXPECTED_CRATES))}",
          f"{path.name}: {len(components)} components, missing {sorted(missing)}")
    binaries = {c.get("name") for c in top.get("components", [])}
    check(set(BINS) <= binaries, f"{path.name}: the five binaries as the release's parts",
          f"{path.name}: metadata.component's parts are {sorted(binaries)}")
    no_purl = [c.get("name") for c in components if not c.get("purl")]
    no_licence = [c.get("name") for c in components if not c.get("licenses")]
    check(not no_purl, f"{path.name}: every component has a purl", f"{path.name}: without a purl: {no_purl[:10]}")
    check(len(no_licence) <= len(components) // 20,
          f"{path.name}: {len(components) - len(no_licence)} of {len(components)} components name their licence",
          f"{path.name}: {len(no_licence)} components without a licence: {no_licence[:10]}")


def verify_sdks(dist, version):
    pyv = python_version(version)
    wheel = dist / f"sluice_sdk-{pyv}-py3-none-any.whl"
    if check(wheel.is_file(), f"{wheel.name} is there", f"no {wheel.name} in {sorted(p.name for p in dist.iterdir())}"):
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            meta = z.read(f"sluice_sdk-{pyv}.dist-info/METADATA").decode()
            fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", meta.split("\n\n")[0], re.M))
            check(fields.get("Name") == "sluice-sdk" and fields.get("Version") == pyv,
                  f"{wheel.name}: METADATA names sluice-sdk {pyv}",
                  f"{wheel.name}: METADATA Name {fields.get('Name')!r} Version {fields.get('Version')!r}")
            check(fields.get("License-Expression") == "Apache-2.0" or fields.get("License") == "Apache-2.0",
                  f"{wheel.name}: licence Apache-2.0", f"{wheel.name}: licence fields {fields.get('License-Expression')!r}")
            want = {"sluice/__init__.py", "sluice/py.typed", "sluice/adapters/openai_agents.py",
                    "sluice/adapters/langgraph.py"}
            check(want <= set(names) and not any(n.startswith("tests/") for n in names),
                  f"{wheel.name}: the package with py.typed and the framework adapters, no tests ({len(names)} files)",
                  f"{wheel.name}: lacks {sorted(want - set(names))} or carries tests: {names}")
    sdist = dist / f"sluice_sdk-{pyv}.tar.gz"
    if check(sdist.is_file(), f"{sdist.name} is there", f"no {sdist.name}"):
        with tarfile.open(sdist) as tar:
            names = set(tar.getnames())
            base = f"sluice_sdk-{pyv}"
            want = {f"{base}/pyproject.toml", f"{base}/PKG-INFO", f"{base}/src/sluice/__init__.py"}
            pkg_info = tar.extractfile(f"{base}/PKG-INFO").read().decode() if f"{base}/PKG-INFO" in names else ""
            check(want <= names and f"\nVersion: {pyv}\n" in pkg_info,
                  f"{sdist.name}: pyproject.toml, the sources, PKG-INFO of version {pyv}",
                  f"{sdist.name}: lacks {sorted(want - names)} or PKG-INFO names another version")
    npm = dist / f"sluice-client-{version}.tgz"
    if check(npm.is_file(), f"{npm.name} is there", f"no {npm.name}"):
        with tarfile.open(npm) as tar:
            names = set(tar.getnames())
            pkg = json.load(io.TextIOWrapper(tar.extractfile("package/package.json")))
            check(pkg.get("name") == "@sluice/client" and pkg.get("version") == version,
                  f"{npm.name}: package.json names @sluice/client {version}",
                  f"{npm.name}: package.json {pkg.get('name')} {pkg.get('version')}")
            entries = ["index", "tool-server/index", "adapters/openai-agents", "adapters/ai-sdk"]
            want = {f"package/dist/{entry}{ext}" for entry in entries for ext in (".js", ".d.ts")}
            want.add("package/README.md")
            stray = sorted(n for n in names if n.startswith(("package/src/", "package/test/", "package/node_modules/")))
            check(want <= names and not stray,
                  f"{npm.name}: dist/ (JavaScript and types of every entry point) and the README, no sources or tests",
                  f"{npm.name}: lacks {sorted(want - names)}, carries {stray[:10]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dist", required=True, type=Path)
    ap.add_argument("--version", required=True)
    ap.add_argument("--revision")
    ap.add_argument("--target")
    ap.add_argument("--sdks-only", action="store_true")
    args = ap.parse_args()
    dist = args.dist
    verify_sdks(dist, args.version)
    if not args.sdks_only:
        v, t, r = args.version, args.target, args.revision
        verify_tarball(dist / f"sluice-{v}-{t}.tar.gz", f"sluice-{v}-{t}", BINS + DOCS, v, r, DISTROLESS_CC)
        verify_tarball(dist / f"sluice-demo-{v}-{t}.tar.gz", f"sluice-demo-{v}-{t}", ["sluice-upstream", "LICENSE"],
                       v, r, DISTROLESS_CC)
        verify_sbom(dist / f"sluice-{v}-{t}.cdx.json", v, r)
        verify_sums(dist)
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One CycloneDX SBOM for a release from cargo-cyclonedx's documents of its binaries.

    sbom.py --version V --revision R --source-root DIR --out FILE BOM...

cargo-cyclonedx (`--describe binaries`) writes one document per binary; the release tarball
holds five, so this merges them into one document describing `sluice` V: the five binaries as
the parts of its metadata component, every crate any of them links as a component (once, by
bom-ref), and the union of their dependency graphs. The workspace's own crates carry the
absolute path cargo-cyclonedx ran in; it is rewritten to a path relative to the repository, so
the document does not depend on where it was made. The timestamp is SOURCE_DATE_EPOCH's and the
serial number is derived from the version, revision and target: the same commit gives the same
document. scripts/release/verify.py validates the result against the CycloneDX schema.
"""
import argparse
import json
import os
import sys
import uuid
from datetime import datetime, timezone


def relative(text, root):
    """`path+file:///tmp/x/services/producer#...` -> `path+file:services/producer#...`."""
    return text.replace(f"path+file://{root}/", "path+file:")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--source-root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("boms", nargs="+")
    args = ap.parse_args()
    root = os.path.realpath(args.source_root)

    docs = []
    for path in args.boms:
        with open(path) as f:
            docs.append(json.loads(relative(f.read(), root)))
    specs = {d["specVersion"] for d in docs}
    if len(specs) != 1:
        sys.exit(f"sbom.py: the documents mix CycloneDX versions {sorted(specs)}")
    targets = {p["value"] for d in docs for p in d["metadata"].get("properties", [])
               if p["name"] == "cdx:rustc:sbom:target:triple"}
    target = ",".join(sorted(targets)) or "unknown"

    top_ref = f"sluice@{args.version}"
    binaries = [d["metadata"]["component"] for d in docs]
    components, seen = [], set()
    for d in docs:
        for c in d.get("components", []):
            if c["bom-ref"] not in seen:
                seen.add(c["bom-ref"])
                components.append(c)
    depends = {}
    for d in docs:
        for dep in d.get("dependencies", []):
            depends.setdefault(dep["ref"], set()).update(dep.get("dependsOn", []))
    depends[top_ref] = {b["bom-ref"] for b in binaries}

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or int(datetime.now(timezone.utc).timestamp())
    merged = {
        "bomFormat": "CycloneDX",
        "specVersion": specs.pop(),
        "serialNumber": "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL,
                                                     f"sluice/{args.version}/{args.revision}/{target}")),
        "version": 1,
        "metadata": {
            "timestamp": datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": docs[0]["metadata"].get("tools", []),
            "component": {
                "type": "application",
                "bom-ref": top_ref,
                "name": "sluice",
                "version": args.version,
                "description": "Sluice release binaries: sluice, sluice-producer, sluice-dispatcher, "
                               "sluice-reconciler, sluice-compensator",
                "licenses": [{"expression": "Apache-2.0"}],
                "purl": f"pkg:generic/sluice@{args.version}",
                "components": binaries,
            },
            "properties": [
                {"name": "cdx:rustc:sbom:target:triple", "value": target},
                {"name": "sluice:revision", "value": args.revision},
            ],
        },
        "components": sorted(components, key=lambda c: c["bom-ref"]),
        "dependencies": [{"ref": ref, "dependsOn": sorted(on)} for ref, on in sorted(depends.items())],
    }
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=2)
        f.write("\n")
    print(f"{args.out}: {len(binaries)} binaries, {len(components)} components")


if __name__ == "__main__":
    main()

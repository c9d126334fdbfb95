#!/usr/bin/env python3
"""Converts CustomResourceDefinitions to the JSON Schemas kubeconform validates custom resources
against, one file per served version: OUT/<group>/<kind>_<version>.json (kind lower-cased, as
kubeconform's `{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json` location names it).

    crd2jsonschema.py OUT crd.yaml [crd.yaml ...]

What kubeconform's own openapi2jsonschema.py does, for the parts these CRDs use:
  * strict: an object schema with `properties` and no `additionalProperties` gets
    `additionalProperties: false` (a misspelt field is an error, as with the Kubernetes
    schemas' -strict variants), except under `x-kubernetes-preserve-unknown-fields`;
  * `x-kubernetes-int-or-string` becomes `anyOf: [integer, string]`;
  * `nullable: true` adds "null" to the type;
  * apiVersion and kind are pinned to the CRD's group/version and kind.
"""

import json
import sys
from pathlib import Path

import yaml


def convert(node):
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: convert(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    preserve = out.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out = Path(argv[1])
    written = 0
    for path in argv[2:]:
        for crd in yaml.safe_load_all(Path(path).read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served", True):
                    continue
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    sys.exit(f"{path}: {kind} {version['name']} has no openAPIV3Schema")
                schema = convert(schema)
                props = schema.setdefault("properties", {})
                props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
                props["kind"] = {"type": "string", "enum": [kind]}
                schema["$schema"] = "http://json-schema.org/draft-07/schema#"
                target = out / group / f"{kind.lower()}_{version['name']}.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema, indent=1, sort_keys=True))
                written += 1
                print(f"{target}: {kind} {group}/{version['name']} from {Path(path).name}")
    if not written:
        sys.exit("crd2jsonschema.py: no CustomResourceDefinition found")


if __name__ == "__main__":
    main(sys.argv)

"""``python -m sluice.tool MODULE:APP BASE_URL``: print a ToolApp's catalog entries.

``MODULE:APP`` names the app as uvicorn takes it; ``BASE_URL`` is where Sluice reaches it.
Importing the module builds the app, so its signing keys must be at hand as when it serves
(``SLUICE_TOOL_SIGNING_KEYS``); only their names, never their values, are printed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .app import DEFAULT_CREDENTIAL, ToolApp
from .signing import ENV_VAR, SigningKeyError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.tool", description="Print the Sluice catalog entries of a ToolApp."
    )
    parser.add_argument("app", help="the app as MODULE:ATTRIBUTE (as uvicorn takes it)")
    parser.add_argument("base_url", help="where Sluice reaches the app, e.g. http://127.0.0.1:9000")
    parser.add_argument(
        "--credential",
        help=f"the name of the credential Sluice signs with (default: {DEFAULT_CREDENTIAL})",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--keys-env",
        metavar="VAR",
        help=f"the variable Sluice reads the whsec_ keys from (default: {ENV_VAR})",
    )
    source.add_argument(
        "--keys-file", metavar="PATH", help="a file Sluice reads the whsec_ keys from instead"
    )
    options = parser.parse_args(argv)
    module, _, attribute = options.app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        app = getattr(importlib.import_module(module), attribute or "app", None)
    except SigningKeyError as error:
        parser.error(f"{options.app} could not be built: {error}")
    if not isinstance(app, ToolApp):
        parser.error(f"{options.app} is not a sluice.tool.ToolApp")
    printed = app.catalog_toml(
        options.base_url,
        credential=options.credential,
        keys_env=options.keys_env,
        keys_file=options.keys_file,
    )
    print(printed, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

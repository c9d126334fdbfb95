"""``python -m sluice.tool MODULE:APP BASE_URL``: print a ToolApp's catalog entries.

``MODULE:APP`` names the app as uvicorn takes it; ``BASE_URL`` is where Sluice reaches it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .app import ToolApp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.tool", description="Print the Sluice catalog entries of a ToolApp."
    )
    parser.add_argument("app", help="the app as MODULE:ATTRIBUTE (as uvicorn takes it)")
    parser.add_argument("base_url", help="where Sluice reaches the app, e.g. http://127.0.0.1:9000")
    options = parser.parse_args(argv)
    module, _, attribute = options.app.partition(":")
    sys.path.insert(0, os.getcwd())
    app = getattr(importlib.import_module(module), attribute or "app", None)
    if not isinstance(app, ToolApp):
        parser.error(f"{options.app} is not a sluice.tool.ToolApp")
    print(app.catalog_toml(options.base_url), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

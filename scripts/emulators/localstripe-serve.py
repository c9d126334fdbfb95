"""Runs localstripe's app on one loopback address, with its state in memory only.

The `localstripe` command itself binds [::] (every interface, no option to change it) and
pickles its whole state to /tmp/localstripe.pickle after every write. That one file is shared
by every localstripe on the machine, and a later start loads it unless --from-scratch is
given. This launcher serves the same aiohttp app (localstripe.server.app, unchanged) on
--host/--port and turns the pickling off, so each instance starts empty and keeps its state to
itself. DELETE /_config/data still empties it.

Usage: python localstripe-serve.py --port PORT [--host 127.0.0.1]
"""

import argparse
import logging

from aiohttp import web
from localstripe import resources
from localstripe.server import app


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    # Store.__setitem__, __delitem__ and the app's save middleware all call this.
    resources.Store.dump_to_disk = lambda self: None

    # localstripe's own start(): every request in the access log.
    logger = logging.getLogger("aiohttp.access")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler())

    web.run_app(app, host=args.host, port=args.port, access_log=logger)


if __name__ == "__main__":
    main()

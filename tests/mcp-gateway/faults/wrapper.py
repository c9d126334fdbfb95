#!/usr/bin/env python3
"""A stdio fault wrapper: sits between Sluice and a real stdio MCP server and injects the faults
a test chose in a control file (see rules.py). Usage:

    wrapper.py --control FILE [--env-digest NAME]... -- COMMAND [ARGS...]

It starts COMMAND, passes every newline-delimited JSON-RPC message through unchanged both ways
(stderr is the server's own), and only for a `tools/call` a rule fires on does it withhold the
answer and close the stream, or kill the server. Without --control (or with a control file that
names no rule for a tool) it is a plain pipe. `--env-digest NAME` logs the SHA-256 of the
environment variable NAME as the server receives it (never the value): how a test sees that a
credential reached the server without the secret being written anywhere. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from rules import Fault, Rules, call_of, id_key, meta_of


def main() -> None:
    argv = sys.argv[1:]
    control = None
    digests: list[str] = []
    while argv[:1] in (["--control"], ["--env-digest"]):
        if argv[0] == "--control":
            control = argv[1]
        else:
            digests.append(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: wrapper.py [--control FILE] -- COMMAND [ARGS...]")
    rules = Rules(control or os.environ.get("SLUICE_FAULT_CONTROL"))
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    rules.log("started", server_pid=server.pid, command=argv[0],
              env_sha256={name: hashlib.sha256(os.environ[name].encode()).hexdigest()
                          for name in digests if name in os.environ})
    pending: dict[str, Fault] = {}
    lock = threading.Lock()
    out = sys.stdout.buffer

    def end(code: int) -> None:
        """Closes the stream Sluice reads: our stdout, then the process."""
        try:
            out.flush()
        except OSError:
            pass
        os._exit(code)

    def kill(fault: Fault, tool_call: Any) -> None:
        # Logged first: once the server is dead the other thread may end the process.
        rules.log("killed", rule=fault.rule_id, id=tool_call, server_pid=server.pid)
        server.send_signal(signal.SIGKILL)
        server.wait()
        end(137)

    def requests() -> None:
        stdin = sys.stdin.buffer
        for line in stdin:
            fault = None
            call = None
            try:
                call = call_of(json.loads(line))
            except ValueError:
                pass
            if call is not None:
                tool, request_id = call
                fault = rules.on_call(tool)
                if fault is not None:
                    with lock:
                        pending[id_key(request_id)] = fault
                    rules.log("armed", rule=fault.rule_id, tool=tool, id=request_id, action=fault.action)
            if fault is not None and fault.action == "lose":
                rules.log("lost", rule=fault.rule_id, id=call[1] if call else None)
                server.send_signal(signal.SIGTERM)
                end(0)
            try:
                server.stdin.write(line)
                server.stdin.flush()
            except OSError:
                break
            if call is not None:
                rules.log("forwarded", tool=call[0], id=call[1], meta=meta_of(line))
            if fault is not None and fault.action == "kill" and fault.when == "request":
                time.sleep(fault.delay_ms / 1000)
                kill(fault, call[1] if call else None)
        # Sluice closed our stdin: close the server's and let it finish.
        try:
            server.stdin.close()
        except OSError:
            pass

    threading.Thread(target=requests, daemon=True).start()
    for line in server.stdout:
        fault = None
        message_id = None
        try:
            message = json.loads(line)
            if isinstance(message, dict) and "id" in message and "method" not in message:
                message_id = message["id"]
                with lock:
                    fault = pending.pop(id_key(message_id), None)
        except ValueError:
            pass
        if fault is not None and fault.action == "kill":
            kill(fault, message_id)
        if fault is not None:
            # The server answered (it acted); nobody hears it: the stream closes instead.
            rules.log("dropped", rule=fault.rule_id, id=message_id, answer=line.decode(errors="replace")[:2000])
            server.send_signal(signal.SIGTERM)
            end(0)
        out.write(line)
        out.flush()
    code = server.wait()
    rules.log("server exited", code=code)
    end(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()

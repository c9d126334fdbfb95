#!/usr/bin/env python3
"""An HTTP fault proxy: sits between Sluice and a real MCP server reached over streamable HTTP and
injects the faults a test chose in a control file (see rules.py). Usage:

    proxy.py --control FILE [--listen 127.0.0.1:0] [--header-digest NAME]... -- COMMAND [ARGS...]

COMMAND is the HTTP server (here mcp-proxy serving a stdio server over streamable HTTP); every
`{port}` in its arguments is replaced by a free loopback port, and the proxy forwards
`/mcp` (and every other path) there. It prints `listening on http://127.0.0.1:N` once both are
up. Requests and answers pass through unchanged (answers streamed, so a server-sent-events
stream flows as it comes); only for a `tools/call` a rule fires on does it:
- `drop`: forward it, read the server's whole answer (it acted), and close the client's
  connection without writing a byte of it;
- `lose`: close the client's connection without forwarding it (the server never saw it);
- `kill`: forward it, SIGKILL the server's process group (the bridge and the server behind it)
  when its answer starts (`when = "answer"`) or `delay_ms` after the request went
  (`when = "request"`), and close the client's connection. The server is started again on the
  next request, as an operator's supervisor would.
`--header-digest NAME` logs, with each `tools/call`, the SHA-256 of request header NAME (never
its value): how a test sees a credential arrive without writing it anywhere. Standard library
only.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from rules import Rules, call_of, meta_of

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """The real server: started (again) on demand, killed on a `kill` fault."""

    def __init__(self, command: list[str], rules: Rules) -> None:
        self.command = command
        self.rules = rules
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def ensure(self) -> int:
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                return self.port
            self.port = free_port()
            argv = [a.replace("{port}", str(self.port)) for a in self.command]
            self.process = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
            self.rules.log("upstream started", pid=self.process.pid, port=self.port)
            end = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    return self.port
                except OSError:
                    if self.process.poll() is not None or time.monotonic() > end:
                        raise RuntimeError(f"the upstream {argv[0]} did not listen on {self.port}")
                    time.sleep(0.05)

    def kill(self) -> None:
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                self.rules.log("killed", pid=self.process.pid)

    def stop(self) -> None:
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)


def handler(upstream: Upstream, rules: Rules, digests: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:
            pass

        def cut(self) -> None:
            """Closes the client's connection with nothing (more) written."""
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def relay(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            fault = None
            call: Any = None
            if self.command == "POST" and body:
                try:
                    call = call_of(json.loads(body))
                except ValueError:
                    call = None
                if call is not None:
                    fault = rules.on_call(call[0])
                    if fault is not None:
                        rules.log("armed", rule=fault.rule_id, tool=call[0], id=call[1], action=fault.action)
            if fault is not None and fault.action == "lose":
                rules.log("lost", rule=fault.rule_id, id=call[1])
                self.cut()
                return
            port = upstream.ensure()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
            headers["Host"] = f"127.0.0.1:{port}"
            try:
                connection.request(self.command, self.path, body=body if body else None, headers=headers)
                if call is not None:
                    rules.log("forwarded", tool=call[0], id=call[1], meta=meta_of(body),
                              header_sha256={name: hashlib.sha256(self.headers[name].encode()).hexdigest()
                                             for name in digests if self.headers.get(name) is not None})
                if fault is not None and fault.action == "kill" and fault.when == "request":
                    time.sleep(fault.delay_ms / 1000)
                    upstream.kill()
                    self.cut()
                    return
                answer = connection.getresponse()
                if call is not None:
                    rules.log("answered", tool=call[0], id=call[1], status=answer.status)
                if fault is not None and fault.action == "kill":
                    upstream.kill()
                    self.cut()
                    return
                if fault is not None:
                    data = answer.read()
                    rules.log("dropped", rule=fault.rule_id, id=call[1], answer=data.decode(errors="replace")[:2000])
                    self.cut()
                    return
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                length = answer.getheader("content-length")
                if length is not None:
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    self.wfile.write(answer.read())
                    return
                # A stream (server-sent events): passed on as it comes, chunked.
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    chunk = answer.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (OSError, http.client.HTTPException) as error:
                rules.log("upstream failed", error=str(error))
                self.cut()
            finally:
                connection.close()

        do_GET = do_POST = do_DELETE = relay  # noqa: N815 (http.server's naming)

    return Handler


def main() -> None:
    argv = sys.argv[1:]
    control = None
    listen = "127.0.0.1:0"
    digests: list[str] = []
    while argv and argv[0] != "--":
        if argv[0] == "--control":
            control, argv = argv[1], argv[2:]
        elif argv[0] == "--header-digest":
            digests.append(argv[1])
            argv = argv[2:]
        elif argv[0] == "--listen":
            listen, argv = argv[1], argv[2:]
        else:
            sys.exit(f"proxy.py: unknown option {argv[0]}")
    argv = argv[1:]
    if not argv:
        sys.exit("usage: proxy.py [--control FILE] [--listen HOST:PORT] -- COMMAND [ARGS...]")
    rules = Rules(control or os.environ.get("SLUICE_FAULT_CONTROL"))
    upstream = Upstream(argv, rules)
    upstream.ensure()
    host, port = listen.rsplit(":", 1)
    server = http.server.ThreadingHTTPServer((host, int(port)), handler(upstream, rules, digests))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: (upstream.stop(), os._exit(0)))
    print(f"listening on http://{host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()

"""Loopback HTTP servers for the client tests: bound to 127.0.0.1, run in a daemon thread, stopped by the test."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: A route answers (status, body bytes) for (method, path, headers, body).
Route = Callable[[str, str, dict[str, str], bytes], tuple[int, bytes]]


def json_body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


@contextlib.contextmanager
def running(server: ThreadingHTTPServer) -> Iterator[str]:
    """Serve in a daemon thread; yield the base URL; shut down and close on exit."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def fake_server(route: Route) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (free port) whose every answer comes from ``route``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, payload = route(self.command, self.path, dict(self.headers), body)
            if status == 0:  # hang up without an answer, as a crashing server does
                self.close_connection = True
                return
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up first (timeout tests)
                self.close_connection = True

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server

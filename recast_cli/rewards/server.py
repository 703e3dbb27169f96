"""``recast serve-reward``: the HTTP server of protocol ``recast.reward/1`` (``rewards/remote.py``).

The server binds 127.0.0.1 unless told otherwise and scores one request at a time. Its limits
are derived from the batch it accepts: at most ``max_batch`` images of at most ``max_pixels``
pixels each (checked from each PNG's header before decoding: 413), a body of at most
``body_limit(max_batch, max_pixels)`` bytes, the largest our client can send for such a batch
(413), at most ``readers`` bodies read at once (503 when busy). The head and body deadlines, the
rate floor and the connection caps that keep idle and slow clients from holding it are
``rewards/serve_limits.py``'s (``Pace``, ``RequestReader``, ``Admission``), applied here. Besides:

* a body nested too deeply for the JSON parser is 400, a body shorter than its
  ``Content-Length`` is 400 and closed, and a client that leaves before its reply is one
  log line: none of them prints a traceback or stops the server.
"""

from __future__ import annotations

import hmac
import io
import json
import socket
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Scorer
from recast_cli.rewards.remote import PROTOCOL, TOKEN_ENV, range_to_json
from recast_cli.rewards.serve_limits import (HEADER_DEADLINE_S, MAX_BATCH, MAX_CONNECTIONS, RATE_WINDOW_S, READERS,
                                             REQUEST_GRACE_S, REQUEST_MAX_S, REQUEST_MIN_RATE, SERVER_MAX_PIXELS,
                                             Admission, Pace, RequestDeadline, RequestReader, body_limit, log_client,
                                             write_log)
from recast_cli.rewards.transport import decode_png_base64

LOOPBACK = ("127.0.0.1", "::1", "localhost")
SOCKET_TIMEOUT_S = 30.0  # writing a reply, and waiting for a reader slot
LISTEN_BACKLOG = 128  # connections the kernel queues for accept: a flood does not drop a client's SYN


def _raw_reply(sock: socket.socket, status: int, error: str) -> None:
    """Answer ``status`` with ``{"error": error}`` and ``Connection: close`` outside the HTTP handler
    (no request was parsed), without waiting on a client that does not read: best effort."""
    body = json.dumps({"error": error}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    try:
        sock.setblocking(False)
        sock.send(head.encode() + body)
    except OSError:
        pass


class RewardServer(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_connections`` connections (one thread each) open at
    once (``Admission``): a flood of connections cannot create threads without bound, nor idle
    ones keep others out. When every connection is busy with an authenticated request, one more
    is answered 503 by the accepting thread and closed (clients retry 503)."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int = MAX_CONNECTIONS) -> None:
        self.max_connections = max_connections
        self.admission = Admission(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.admission.enter(request, client_address):
            self.admission.log.line(client_address, f"refused: all {self.max_connections} connections are busy with "
                                    "requests (503)", "503")
            _raw_reply(request, 503, f"busy: all {self.max_connections} connections are busy with requests; retry")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.admission.leave(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """The stdlib's, with the connection leaving ``admission`` before its socket is closed."""
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.admission.leave(request)
            self.shutdown_request(request)


def make_server(scorer: Scorer, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                max_batch: int = MAX_BATCH, max_pixels: int = SERVER_MAX_PIXELS, timeout: float = SOCKET_TIMEOUT_S,
                readers: int = READERS, max_connections: int = MAX_CONNECTIONS, grace: float = REQUEST_GRACE_S,
                min_rate: float = REQUEST_MIN_RATE, window: float = RATE_WINDOW_S,
                header_s: float = HEADER_DEADLINE_S, max_request_s: float = REQUEST_MAX_S) -> RewardServer:
    """A reward server for ``scorer`` bound to (host, port); port 0 picks a free one. Not started.

    ``timeout`` bounds writing a reply and waiting for a reader slot; ``header_s``, ``grace``,
    ``min_rate``, ``window`` and ``max_request_s`` pace each request (``Pace``; ``max_request_s``
    is raised to cover the body limit at ``min_rate``: the handler class's ``pace``);
    ``max_connections`` caps open connections (``Admission``).
    """
    pace = Pace(header_s=header_s, grace=grace, min_rate=min_rate, window=window, max_s=max_request_s)
    return RewardServer((host, port), _handler(scorer, token, max_batch, max_pixels, timeout, readers, pace),
                        max_connections)


class RewardHandler(BaseHTTPRequestHandler):
    """One connection of a reward server: protocol ``recast.reward/1`` over HTTP/1.1 keep-alive.

    Abstract: :func:`_handler` makes the subclass of each server, whose class attributes below are that
    server's scorer, token, limits, pace, scoring lock and reader slots.
    """

    protocol_version = "HTTP/1.1"
    server: RewardServer
    scorer: Scorer
    expected: bytes | None  # the token's bytes; None: no token needed
    max_batch: int
    max_pixels: int
    max_body: int  # body_limit(max_batch, max_pixels)
    timeout: float  # the socket's timeout between reads (StreamRequestHandler's): writing a reply
    request_pace: Pace  # read by tests
    scoring: threading.Lock
    reading: threading.BoundedSemaphore

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # every read goes through the request's deadline instead
        self.reader = RequestReader(self.connection, self.request_pace, self.timeout,
                                    heard=lambda: self.server.admission.heard(self.connection))
        self.rfile = io.BufferedReader(self.reader)
        self.served = 0

    def handle_one_request(self) -> None:
        self.reader.begin()
        if self.served and not self.server.admission.enter(self.connection, self.client_address):
            self.close_connection = True  # kept alive, and no room left while it waits: closed
            return
        try:
            super().handle_one_request()
            self.served += 1
        except RequestDeadline as exc:
            self.close_connection = True
            if self.served and not self.reader.received:
                return  # a kept-alive connection left idle: closed without a word
            self._log(f"{exc.what} ({exc}): {exc.status}, closed", str(exc.status))
            _raw_reply(self.connection, exc.status, f"{exc.what} ({exc})")
        except ConnectionError as exc:  # reset while we read
            self.close_connection = True
            self._log(f"client disconnected ({type(exc).__name__})", "reset")

    def _log(self, text: str, kind: str) -> None:
        """One log line about this connection; while it has no authenticated request, written at most once per
        address and ``kind`` every few seconds (``ClientLog``): a flood without the token cannot fill the log."""
        admission = self.server.admission
        if admission.is_authenticated(self.connection):
            log_client(self.client_address, text)
        else:
            admission.log.line(self.client_address, text, kind)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # replies are logged by _send once written (or not)

    def log_message(self, format: str, *args: Any) -> None:  # anything else the stdlib logs
        self._log(format % args, "stdlib")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own refusals (malformed request line or headers, unknown method) in the
        protocol's form, ``{"error": "one line"}``, and closed."""
        self.close_connection = True
        self._send(code, {"error": message or HTTPStatus(code).phrase})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        """Reply; log one line: the request, the status, the error if any, and whether it was delivered."""
        body = json.dumps(payload, allow_nan=False).encode()
        line = (f"{getattr(self, 'command', None) or '-'} {getattr(self, 'path', '-')} {status}"
                + (f" ({payload['error']})" if "error" in payload else ""))
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (ConnectionError, TimeoutError) as exc:  # the client left or stopped reading
            self.close_connection = True
            self._log(f"{line} not delivered: client disconnected ({type(exc).__name__})", "undelivered")
            return
        self._log(line, str(status))

    def _authorised(self) -> bool:
        """Whether the request carries the right token (401 else); a connection closed to make
        room while its head arrived is dropped without a word (its closing was logged)."""
        admission = self.server.admission
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        if self.expected is None or (scheme.lower() == "bearer"
                                     and hmac.compare_digest(given.strip().encode(), self.expected)):
            if admission.authenticate(self.connection):
                return True
            self.close_connection = True
            return False
        self.close_connection = True
        if admission.holds(self.connection):
            self._send(401, {"error": "wrong or missing token"})
        return False

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path != "/v1/info":
            self._send(404, {"error": f"no such endpoint {self.path}"})
            return
        self._send(200, {"protocol": PROTOCOL, "scorer": self.scorer.name,
                         "output_range": range_to_json(self.scorer.output_range),
                         "max_batch": self.max_batch, "max_pixels": self.max_pixels})

    def _content_length(self) -> int | None:
        """The declared body length, or None once a 411/413 is sent."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if 0 < length <= self.max_body:
            return length
        self.close_connection = True
        self._send(413 if length else 411, {"error": f"body must be 1..{self.max_body} bytes ({self.max_batch} "
                                                     f"images of at most {self.max_pixels} pixels)"})
        return None

    def _read_request(self, length: int) -> tuple[list, list[str]] | None:
        """The images and prompts of a body of ``length`` bytes, read in a reader slot; None once an
        error is sent. A slot is waited for at most ``timeout`` (503); the body's deadline and rate
        windows start once it has one (``RequestReader.start_body``): a late or slow body raises
        RequestDeadline (408), which frees the slot."""
        from recast_cli.images import ImageTooLarge

        if not self.reading.acquire(timeout=self.timeout):
            self.close_connection = True
            self._send(503, {"error": "busy: too many requests being read; retry"})
            return None
        self.reader.start_body(length)
        try:
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                self._send(400, {"error": f"body ended after {len(body)} of {length} bytes"})
                return None
            return _parse_score_request(body, self.max_batch, self.max_pixels)
        except ImageTooLarge as exc:
            self.close_connection = True
            self._send(413, {"error": str(exc)})
        except BadInput as exc:
            self._send(400, {"error": str(exc)})
        finally:
            self.reading.release()
        return None

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if self.path != "/v1/score":
            self.close_connection = True
            self._send(404, {"error": f"no such endpoint {self.path}"})
            return
        length = self._content_length()
        parsed = None if length is None else self._read_request(length)
        if parsed is None:
            return
        images, prompts = parsed
        try:
            with self.scoring:
                scores = self.scorer.score(images, prompts)
                extras = self.scorer.extras()
            payload = {"scores": [float(s) for s in scores], "extras": extras}
            json.dumps(payload, allow_nan=False)  # a NaN score fails here, as a 500, not mid-reply
        except BadInput as exc:
            self._send(400, {"error": str(exc)})
            return
        except Exception as exc:  # report any scorer failure as 500 and keep serving
            write_log(f"serve-reward: internal error\n{traceback.format_exc()[-3000:]}")  # never waits on stderr
            self._send(500, {"error": f"internal error: {type(exc).__name__}"})
            return
        self._send(200, payload)


def _handler(scorer: Scorer, token: str | None, max_batch: int, max_pixels: int, timeout: float, readers: int,
             pace: Pace) -> type[RewardHandler]:
    """The request handler class of one server: a subclass of :class:`RewardHandler` holding its scorer,
    token, limits and pace, and its own scoring lock and reader slots (shared by that server's threads)."""
    max_body = body_limit(max_batch, max_pixels)
    return type("Handler", (RewardHandler,), {
        "scorer": scorer,
        "expected": token.encode() if token else None,
        "max_batch": max_batch,
        "max_pixels": max_pixels,
        "max_body": max_body,
        "timeout": timeout,
        "request_pace": pace.covering(max_body),  # a client keeping the floor finishes the largest body
        "scoring": threading.Lock(),  # scorers hold one model each: score one request at a time
        "reading": threading.BoundedSemaphore(readers),  # bodies in memory at once
    })


def _parse_score_request(body: bytes, max_batch: int = MAX_BATCH,
                         max_pixels: int = SERVER_MAX_PIXELS) -> tuple[list, list[str]]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput("request body is not JSON") from None
    except RecursionError:  # e.g. 100k nested '[': the parser's stack, not ours, is the limit
        raise BadInput("request body nests too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or not isinstance(data.get("prompts"), list):
        raise BadInput('request must be {"prompts": [...], "images": [...]}')
    if not all(isinstance(p, str) for p in data["prompts"]):
        raise BadInput("every prompt must be a string")
    if len(data["images"]) > max_batch:
        raise BadInput(f"a request holds at most {max_batch} images, got {len(data['images'])}")
    return [decode_png_base64(x, "request", max_pixels) for x in data["images"]], data["prompts"]


def serve(scorer: Scorer, host: str, port: int, token: str | None, announce=print, max_batch: int = MAX_BATCH,
          max_pixels: int = SERVER_MAX_PIXELS, max_connections: int = MAX_CONNECTIONS,
          min_rate: float = REQUEST_MIN_RATE) -> None:
    """Serve ``scorer`` until interrupted. Without a token only a loopback host is allowed."""
    if token is None and host not in LOOPBACK:
        raise BadInput(f"serve-reward: binding {host} needs a token (--token or ${TOKEN_ENV})")
    if max_batch < 1 or max_pixels < 1 or max_connections < 1 or not min_rate > 0:
        raise BadInput("serve-reward: --max-batch, --max-pixels, --max-connections and --min-upload-rate "
                       "must be >= 1")
    try:
        server = make_server(scorer, host, port, token, max_batch=max_batch, max_pixels=max_pixels,
                             max_connections=max_connections, min_rate=min_rate)
    except OSError as exc:
        raise BadInput(f"serve-reward: cannot bind {host}:{port} ({exc.strerror or exc})") from None
    bound_host, bound_port = server.server_address[:2]
    announce(f"serving {scorer.name} on http://{bound_host}:{bound_port} ({PROTOCOL}, "
             f"{'token required' if token else 'no token: any local process may call it'})")
    sys.stdout.flush()  # a supervisor reads the bound port from this line
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        scorer.close()

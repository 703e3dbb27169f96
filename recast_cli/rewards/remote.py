"""Process isolation for scorers: ``recast serve-reward`` (server) and ``RemoteScorer`` (client).

Protocol ``recast.reward/1`` (JSON over HTTP; images as base64 PNG; never pickle):

* ``GET /v1/info`` → ``{"protocol": "recast.reward/1", "scorer": NAME, "output_range": [lo, hi],
  "max_batch": N, "max_pixels": P}`` (an infinite bound is ``null``; a client sends at most
  ``max_batch`` images per request, and an older server that leaves the two out is sent its own
  batch size).
* ``POST /v1/score`` with ``{"prompts": [str, ...], "images": [base64 PNG, ...]}`` →
  ``{"scores": [float, ...], "extras": {column: [value, ...]}}``, one entry per image.
* Every request carries ``Authorization: Bearer TOKEN`` when the server has a token;
  a wrong or missing token is HTTP 401. A request the scorer rejects (BadInput) is 400 with
  ``{"error": "one line"}``; an internal failure is 500 (and is retried by the client).

The server binds 127.0.0.1 unless told otherwise and scores one request at a time. Its limits
are derived from the batch it accepts: at most ``max_batch`` images of at most ``max_pixels``
pixels each (checked from each PNG's header before decoding: 413), a body of at most
``body_limit(max_batch, max_pixels)`` bytes, the largest our client can send for such a batch
(413), at most ``readers`` bodies read at once (503 when busy). Neither idle nor slow clients
can hold the server (``Pace``, ``RequestReader``, ``Admission``):

* a request's line and headers (the token among them) must arrive within ``HEADER_DEADLINE_S``
  and ``HEADER_LIMIT`` bytes (408 / 431, closed), before it is authenticated;
* a body gets ``REQUEST_GRACE_S`` plus its declared length at ``REQUEST_MIN_RATE``, fixed when
  its reading starts: bytes received never extend it. The cap on that, ``REQUEST_MAX_S``, is
  raised to what the largest allowed body needs at the rate floor, so it never cuts a client
  that keeps the floor. Within that, a client must stay on the floor's schedule: at the end of
  every ``RATE_WINDOW_S`` window after the grace, the body bytes received must be at least
  ``REQUEST_MIN_RATE`` times the seconds since the grace ended, or it is answered 408, closed and
  loses its reader slot at once. A client ahead of schedule may pause while its lead lasts;
* at most ``max_connections`` connections (one thread each) are open at once. A connection that
  has not yet sent a request with the right token is *unauthenticated*: such connections may hold
  at most half the connections, and those of one address at most a quarter. A new connection over
  a cap closes the oldest unauthenticated connection (of its own address first, else of the address
  holding most), so idle sockets cannot keep an authenticated client out; only when every
  connection is busy with an authenticated request is one more answered 503;
* a body nested too deeply for the JSON parser is 400, a body shorter than its
  ``Content-Length`` is 400 and closed, and a client that leaves before its reply is one
  log line: none of them prints a traceback or stops the server.
"""

from __future__ import annotations

import hmac
import io
import json
import math
import os
import select
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Images, Scorer, as_pil, check_batch, check_batch_size, chunks
from recast_cli.rewards.transport import Endpoint, decode_png_base64, png_base64, request

PROTOCOL = "recast.reward/1"
TOKEN_ENV = "RECAST_REWARD_TOKEN"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_BATCH = 16  # images per request by default: one batch of the served scorer (serve-reward --batch-size)
SERVER_MAX_PIXELS = 1024 * 1024
PROMPT_ROOM = 4096  # bytes of JSON-escaped prompt per image a body may carry
SOCKET_TIMEOUT_S = 30.0  # writing a reply, and waiting for a reader slot
READERS = 2
MAX_CONNECTIONS = 64
LISTEN_BACKLOG = 128  # connections the kernel queues for accept: a flood does not drop a client's SYN
UNAUTHENTICATED_SHARE = 2  # unauthenticated connections hold at most 1/2 of max_connections ...
ADDRESS_SHARE = 4  # ... and those of one address at most 1/4
HEADER_DEADLINE_S = 5.0  # a request's line and headers (its token) arrive within this ...
HEADER_LIMIT = 32 * 1024  # ... in at most this many bytes
REQUEST_GRACE_S = 5.0  # a body gets this ...
REQUEST_MIN_RATE = 1024 * 1024  # ... plus its declared length at this many bytes/s, and keeps on this schedule
RATE_WINDOW_S = 5.0  # checked every this many seconds after the grace
REQUEST_MAX_S = 300.0  # and at most this, or the largest allowed body's time at the rate floor if longer
LOGGED_CHARS = 200  # a client's text (path, error) is cut to this many characters in the log


def png_limit(max_pixels: int) -> int:
    """The largest PNG recast's client sends for one image of at most ``max_pixels`` pixels: 8-bit
    RGB plus one filter byte per row (4 bytes a pixel for an image one pixel wide), incompressible
    noise stored by deflate (a 5-byte block header per 16 KiB) in IDAT chunks (12 bytes per 64 KiB):
    at most 1/1024 more, plus the signature, header and end chunks."""
    raw = 4 * max_pixels
    return raw + raw // 1024 + 1024


def body_limit(max_batch: int = MAX_BATCH, max_pixels: int = SERVER_MAX_PIXELS) -> int:
    """The largest request body a server with these limits can need: ``max_batch`` base64 PNGs of
    at most ``png_limit(max_pixels)`` bytes, each quoted in a JSON list, with a prompt of up to
    ``PROMPT_ROOM`` bytes; about 90 MB at the defaults (16 images of 1024² pixels)."""
    image = 4 * ((png_limit(max_pixels) + 2) // 3) + len('"", ')
    return max_batch * (image + PROMPT_ROOM) + (1 << 16)


def connection_caps(max_connections: int) -> tuple[int, int]:
    """(unauthenticated connections at most, unauthenticated connections of one address at most)."""
    return (max(1, max_connections // UNAUTHENTICATED_SHARE), max(1, max_connections // ADDRESS_SHARE))


def _range_to_json(bounds: tuple[float, float]) -> list[float | None]:
    return [b if math.isfinite(b) else None for b in bounds]


def _range_from_json(value: Any) -> tuple[float, float]:
    lo, hi = value
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


@dataclass(frozen=True)
class Pace:
    """How long a request may take (seconds) and how fast its body must come (bytes/s).

    The head (request line and headers) gets ``header_s`` and ``header_bytes``. A body of
    ``length`` bytes gets ``grace + length / min_rate`` seconds, at most ``max_s``, from when its
    reading starts; at the end of every ``window`` seconds after the grace, the body bytes
    received must be at least ``min_rate`` times the seconds since the grace ended (a cumulative
    schedule: a client ahead of it may pause, a trickler falls behind right after the grace).
    A server's pace is ``covering`` its body limit. Tests scale these down; the server's defaults
    are the module's constants.
    """

    header_s: float = HEADER_DEADLINE_S
    header_bytes: int = HEADER_LIMIT
    grace: float = REQUEST_GRACE_S
    min_rate: float = REQUEST_MIN_RATE
    window: float = RATE_WINDOW_S
    max_s: float = REQUEST_MAX_S

    def body_seconds(self, length: int) -> float:
        """The time a body of ``length`` bytes gets, whatever arrives: it does not grow with bytes received."""
        return min(self.grace + length / self.min_rate, self.max_s)

    def covering(self, max_body: int) -> Pace:
        """This pace with ``max_s`` raised, if need be, to the time a body of ``max_body`` bytes gets
        at the rate floor: a client that keeps a lowered floor always finishes the largest body the
        server allows (at 256 KiB/s, ~350 s for the default ~90 MB limit, not cut at 300 s)."""
        return replace(self, max_s=max(self.max_s, self.grace + max_body / self.min_rate))

    def due(self, elapsed: float) -> float:
        """Body bytes a client on the floor's schedule has sent ``elapsed`` seconds after its body's start."""
        return self.min_rate * (elapsed - self.grace)


class RequestDeadline(Exception):
    """A request the reader stops reading (``RequestReader``): answered ``status`` and closed."""

    status = 408
    what = "request not received in time"


class HeadTooLarge(RequestDeadline):
    """A request line and headers over ``Pace.header_bytes``."""

    status = 431
    what = "request line and headers too large"


class RequestReader(io.RawIOBase):
    """The read side of one connection, with a deadline for each request's head and body.

    ``begin`` starts a request: its head must arrive within ``pace.header_s`` and
    ``pace.header_bytes``. ``start_body`` fixes the body's deadline from its declared length
    (``Pace.body_seconds``) and starts the schedule checks: at the end of each window after the
    grace, a body behind the floor's schedule (``Pace.due``) is cut, and one that keeps it is cut
    at the deadline at the latest. A client ahead of schedule may thus stall while its lead lasts
    (a TCP stall does not kill an upload far ahead of its deadline), and a trickler is cut at the
    first check. Bytes that reached the socket but are not read yet count: a check that finds the
    body behind reads them first. A per-read timeout bounds neither. The socket's own timeout is
    set to what is left before each read and restored to ``write_timeout`` (for replies) after it.
    ``heard`` is called when a head's first bytes arrive.
    """

    def __init__(self, sock: socket.socket, pace: Pace, write_timeout: float,
                 heard: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.sock, self.pace, self.write_timeout, self.heard = sock, pace, write_timeout, heard
        self.begin()

    def begin(self) -> None:
        """A new request starts now (the wait for it on a kept-alive connection counts against its head)."""
        self.started = time.monotonic()
        self.deadline = self.started + self.pace.header_s
        self.received = 0
        self.length: int | None = None  # the body's declared length once its reading started
        self.check_at = math.inf

    def start_body(self, length: int) -> None:
        """The body (``length`` bytes declared) is read from now on: its deadline and schedule start."""
        now = time.monotonic()
        self.started, self.length, self.head_received = now, length, self.received
        self.deadline = now + self.pace.body_seconds(length)
        self.check_at = now + self.pace.grace + self.pace.window

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                raise self._late()
            if now >= self.check_at:
                if self._on_schedule(now):
                    self.check_at += self.pace.window
                    continue
                if not _pending(self.sock):
                    raise self._behind(now)
                until = self.deadline  # behind, but bytes wait: read them, then check again
            else:
                until = min(self.deadline, self.check_at)
            self.sock.settimeout(until - now)
            try:
                count = self.sock.recv_into(buffer)
            except TimeoutError:
                continue
            finally:
                self.sock.settimeout(self.write_timeout)
            if self.length is None and not self.received and count and self.heard:
                self.heard()
            self.received += count
            if self.length is None and self.received > self.pace.header_bytes:
                raise HeadTooLarge(f"more than {self.pace.header_bytes} bytes before the end of the headers")
            return count

    def _on_schedule(self, now: float) -> bool:
        """Whether the body bytes received so far keep up with the rate floor since the grace ended."""
        return self.received - self.head_received >= self.pace.due(now - self.started)

    def _behind(self, now: float) -> RequestDeadline:
        """The 408 of a body found behind the floor's schedule at a check."""
        took = now - self.started
        return RequestDeadline(f"upload below {self.pace.min_rate / 1024:g} KiB/s: "
                               f"{self.received - self.head_received} bytes of the body in {took:.1f} s, "
                               f"{self.pace.due(took):.0f} due after a {self.pace.grace:g} s grace")

    def _late(self) -> RequestDeadline:
        took = time.monotonic() - self.started
        if self.length is None:
            return RequestDeadline(f"{self.received} bytes in {took:.1f} s; a request's line and headers get "
                                   f"{self.pace.header_s:g} s")
        return RequestDeadline(f"{self.received - self.head_received} more bytes in {took:.1f} s; a body of "
                               f"{self.length} bytes gets {self.pace.body_seconds(self.length):.1f} s")


def _pending(sock: socket.socket) -> bool:
    """Whether bytes (or the client's close) wait on ``sock`` to be read, without waiting."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _host(client: Any) -> str:
    """The address of a client (``client_address``: a tuple for TCP)."""
    return str(client[0]) if isinstance(client, tuple) and client else "?"


def _log(client: Any, text: str) -> None:
    """One line on stderr for a client: never a header (they carry the token); its text cut short."""
    text = " ".join(str(text).split())
    if len(text) > LOGGED_CHARS:
        text = text[:LOGGED_CHARS] + "..."
    sys.stderr.write(f"serve-reward: {_host(client)} {text}\n")


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


@dataclass
class _Waiting:
    """An unauthenticated connection: its client address, and whether its thread has read any of its head."""

    client: Any
    heard: bool = False


class Admission:
    """The server's open connections: unauthenticated ones (waiting for a request's head with the
    right token: just accepted, or kept alive between requests) and authenticated ones.

    At most ``limit`` are open, at most ``unauthenticated`` of them unauthenticated and at most
    ``per_address`` of those from one address. A connection over a cap makes room by closing an
    unauthenticated connection of its own address if that address is at its cap, else of the
    address holding most: the oldest *idle* one (nothing read and nothing waiting to be read),
    else the oldest. Sockets left idle thus lose their place to new clients, which send their
    head at once, even when every client shares one address (loopback). When every connection
    is authenticated there is no room (the caller answers 503). A closed connection's socket is
    shut down, so its thread's read returns at once; that happens under the lock, before
    ``leave`` lets the socket be closed.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.unauthenticated, self.per_address = connection_caps(limit)
        self.lock = threading.Lock()
        self.waiting: dict[socket.socket, _Waiting] = {}  # unauthenticated, oldest first
        self.authenticated: set[socket.socket] = set()

    def enter(self, sock: socket.socket, client: Any) -> bool:
        """Count ``sock`` (from ``client``) as unauthenticated from now on, making room as needed;
        False when every other connection is authenticated and the limit is reached."""
        host = _host(client)
        with self.lock:
            self.authenticated.discard(sock)
            self.waiting.pop(sock, None)
            while True:
                mine = [s for s, w in self.waiting.items() if _host(w.client) == host]
                full = (len(self.waiting) >= self.unauthenticated
                        or len(self.waiting) + len(self.authenticated) >= self.limit)
                if len(mine) >= self.per_address:
                    self._close(self._victim(mine), f"{self.per_address} from one address")
                elif full and self.waiting:
                    self._close(self._victim(self._of_busiest_address()), f"{self.unauthenticated} in all")
                elif full:
                    return False
                else:
                    self.waiting[sock] = _Waiting(client)
                    return True

    def heard(self, sock: socket.socket) -> None:
        """``sock``'s thread read the first bytes of a request's head: it is not idle."""
        with self.lock:
            if sock in self.waiting:
                self.waiting[sock].heard = True

    def authenticate(self, sock: socket.socket) -> bool:
        """``sock`` sent a request with the right token; False if it was closed to make room meanwhile."""
        with self.lock:
            if self.waiting.pop(sock, None) is None:
                return False
            self.authenticated.add(sock)
            return True

    def holds(self, sock: socket.socket) -> bool:
        """Whether ``sock`` is still open (not closed to make room)."""
        with self.lock:
            return sock in self.waiting or sock in self.authenticated

    def leave(self, sock: socket.socket) -> None:
        """``sock``'s thread is done with it."""
        with self.lock:
            self.waiting.pop(sock, None)
            self.authenticated.discard(sock)

    def _of_busiest_address(self) -> list[socket.socket]:
        """The unauthenticated connections of the address holding most of them, oldest first."""
        counts = Counter(_host(w.client) for w in self.waiting.values())
        busiest = max(counts, key=counts.__getitem__)
        return [s for s, w in self.waiting.items() if _host(w.client) == busiest]

    def _victim(self, candidates: list[socket.socket]) -> socket.socket:
        """The oldest idle connection of ``candidates`` (oldest first): nothing read by its thread and
        nothing waiting in the kernel to be read (one poll for all); else the oldest."""
        poller = select.poll()
        for sock in candidates:
            poller.register(sock, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}
        return next((s for s in candidates if not self.waiting[s].heard and s.fileno() not in ready), candidates[0])

    def _close(self, sock: socket.socket, cap: str) -> None:
        """Close an unauthenticated connection to make room (under the lock): one log line."""
        client = self.waiting.pop(sock).client
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        _log(client, f"closed: no authenticated request yet, to make room for a new connection "
                     f"(unauthenticated connections: at most {cap})")


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
            _log(client_address, f"refused: all {self.max_connections} connections are busy with requests (503)")
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


def _handler(scorer: Scorer, token: str | None, max_batch: int, max_pixels: int, timeout: float, readers: int,
             pace: Pace) -> type:
    """The request handler class of one server (its scorer, token, limits and pace)."""
    from recast_cli.images import ImageTooLarge

    lock = threading.Lock()  # scorers hold one model each: score one request at a time
    reading = threading.BoundedSemaphore(readers)  # bodies in memory at once
    expected = token.encode() if token else None
    max_body = body_limit(max_batch, max_pixels)
    pace = pace.covering(max_body)  # a client keeping the floor always finishes the largest body

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server: RewardServer
        request_pace = pace  # read by tests

        def setup(self) -> None:
            self.timeout = timeout  # the socket's timeout between reads: writing a reply
            super().setup()
            self.rfile.close()  # every read goes through the request's deadline instead
            self.reader = RequestReader(self.connection, pace, timeout,
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
                _log(self.client_address, f"{exc.what} ({exc}): {exc.status}, closed")
                _raw_reply(self.connection, exc.status, f"{exc.what} ({exc})")
            except ConnectionError as exc:  # reset while we read
                self.close_connection = True
                _log(self.client_address, f"client disconnected ({type(exc).__name__})")

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            pass  # replies are logged by _send once written (or not)

        def log_message(self, format: str, *args: Any) -> None:  # anything else the stdlib logs
            _log(self.client_address, format % args)

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
                _log(self.client_address, f"{line} not delivered: client disconnected ({type(exc).__name__})")
                return
            _log(self.client_address, line)

        def _authorised(self) -> bool:
            """Whether the request carries the right token (401 else); a connection closed to make
            room while its head arrived is dropped without a word (its closing was logged)."""
            admission = self.server.admission
            scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
            if expected is None or (scheme.lower() == "bearer"
                                    and hmac.compare_digest(given.strip().encode(), expected)):
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
            self._send(200, {"protocol": PROTOCOL, "scorer": scorer.name,
                             "output_range": _range_to_json(scorer.output_range),
                             "max_batch": max_batch, "max_pixels": max_pixels})

        def _content_length(self) -> int | None:
            """The declared body length, or None once a 411/413 is sent."""
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if 0 < length <= max_body:
                return length
            self.close_connection = True
            self._send(413 if length else 411, {"error": f"body must be 1..{max_body} bytes "
                                                         f"({max_batch} images of at most {max_pixels} pixels)"})
            return None

        def _read_request(self, length: int) -> tuple[list, list[str]] | None:
            """The images and prompts of a body of ``length`` bytes, read in a reader slot; None once an
            error is sent. A slot is waited for at most ``timeout`` (503); the body's deadline and rate
            windows start once it has one (``RequestReader.start_body``): a late or slow body raises
            RequestDeadline (408), which frees the slot."""
            if not reading.acquire(timeout=timeout):
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
                return _parse_score_request(body, max_batch, max_pixels)
            except ImageTooLarge as exc:
                self.close_connection = True
                self._send(413, {"error": str(exc)})
            except BadInput as exc:
                self._send(400, {"error": str(exc)})
            finally:
                reading.release()
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
                with lock:
                    scores = scorer.score(images, prompts)
                    extras = scorer.extras()
                payload = {"scores": [float(s) for s in scores], "extras": extras}
                json.dumps(payload, allow_nan=False)  # a NaN score fails here, as a 500, not mid-reply
            except BadInput as exc:
                self._send(400, {"error": str(exc)})
                return
            except Exception as exc:  # report any scorer failure as 500 and keep serving
                traceback.print_exc()
                self._send(500, {"error": f"internal error: {type(exc).__name__}"})
                return
            self._send(200, payload)

    return Handler


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


class RemoteScorer(Scorer):
    """A scorer served by ``recast serve-reward`` (protocol in the module docstring).

    ``name`` is the scorer the server must serve (checked against ``/v1/info``); ``token``
    defaults to ``$RECAST_REWARD_TOKEN``. Requests go in batches of ``batch_size`` images (at
    most the server's ``max_batch``), each with ``timeout`` seconds and up to ``retries`` tries
    (backoff doubling from ``backoff``).
    """

    def __init__(self, url: str, name: str | None = None, token: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.5, batch_size: int = 8) -> None:
        self.endpoint = Endpoint(url, float(timeout), int(retries), float(backoff))
        self.batch_size = check_batch_size(name or "remote", batch_size)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.name = name or "remote"
        info = self._call("GET", "/v1/info", None)
        if not isinstance(info, dict) or info.get("protocol") != PROTOCOL:
            raise BadInput(f"{self.name}: {url} does not speak {PROTOCOL}")
        if name is not None and info.get("scorer") != name:
            raise BadInput(f"{name}: the server at {url} serves {info.get('scorer')!r}, not {name!r}")
        self.name = str(info.get("scorer"))
        try:
            self.output_range = _range_from_json(info.get("output_range"))
        except (TypeError, ValueError):
            raise BadInput(f"{self.name}: {url} sent a malformed output_range") from None
        self.batch_size = min(self.batch_size, _server_batch(info, self.batch_size, self.name, url))
        self._extras: dict[str, list] = {}

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        reply = request(self.endpoint, method, path, self.name, body, headers)
        if reply.status == 401:
            raise BadInput(f"{self.name}: {self.endpoint.url} refused the token (wrong or missing; "
                           f"give the server's token with --token or ${TOKEN_ENV})")
        data = reply.json(self.name)
        if reply.status != 200:
            error = data.get("error") if isinstance(data, dict) else None
            raise BadInput(f"{self.name}: {self.endpoint.url} answered HTTP {reply.status}: {error or 'no reason'}")
        return data

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        count = check_batch(self.name, images, prompts)
        pil = as_pil(images)
        out = np.empty(count, dtype=np.float64)
        extras: dict[str, list] = {}
        for part in chunks(count, self.batch_size):
            n = part.stop - part.start
            data = self._call("POST", "/v1/score", {"prompts": list(prompts[part]),
                                                    "images": [png_base64(im) for im in pil[part]]})
            out[part] = _scores_from(data, n, self.name, self.endpoint.url)
            for key, values in _extras_from(data, n, self.name, self.endpoint.url).items():
                extras.setdefault(key, [None] * part.start).extend(values)
            for values in extras.values():
                values.extend([None] * (part.stop - len(values)))
        self._extras = extras
        return out

    def extras(self) -> dict[str, list]:
        return {k: list(v) for k, v in self._extras.items()}


def _server_batch(info: dict[str, Any], default: int, name: str, url: str) -> int:
    """The most images the server takes per request (``max_batch`` of ``/v1/info``; ``default``
    from a server that does not say)."""
    value = info.get("max_batch", default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(f"{name}: {url} sent a malformed max_batch (expected a positive integer)")
    return value


def _scores_from(data: Any, n: int, name: str, url: str) -> list[float]:
    scores = data.get("scores") if isinstance(data, dict) else None
    if (not isinstance(scores, list) or len(scores) != n
            or not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scores)):
        raise BadInput(f"{name}: {url} sent a malformed reply (expected {n} finite scores)")
    return [float(s) for s in scores]


def _extras_from(data: dict[str, Any], n: int, name: str, url: str) -> dict[str, list]:
    extras = data.get("extras", {})
    if not isinstance(extras, dict) or not all(isinstance(v, list) and len(v) == n for v in extras.values()):
        raise BadInput(f"{name}: {url} sent malformed extras (expected lists of {n} values)")
    return extras

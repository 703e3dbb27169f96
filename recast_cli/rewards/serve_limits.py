"""The reward server's admission and pacing: how large a request may be, how fast it must come, who may connect.

The limits follow the batch a server accepts: at most ``max_batch`` images of at most
``max_pixels`` pixels each, in a body of at most ``body_limit(max_batch, max_pixels)`` bytes, the
largest recast's client sends for such a batch (``png_limit``: one image). Neither idle nor slow
clients can hold the server (``Pace``, ``RequestReader``, ``Admission``):

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
  connection is busy with an authenticated request is one more answered 503.

The HTTP server that applies them is ``rewards/server.py``. Its log, one line per client event
(``log_client``), never makes a thread wait on stderr (``write_log``: a line stderr cannot take at once
is left out and counted), and what clients without the token cause (connections closed to make room,
refusals before authentication) is written once per address and kind every ``LOG_EVERY_S`` with the
count left out (``ClientLog``): a flood of sockets cannot fill the log, nor hold the server on it.
"""

from __future__ import annotations

import io
import math
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from recast_cli.rewards.exchange import server_text

MAX_BATCH = 16  # images per request by default: one batch of the served scorer (serve-reward --batch-size)
SERVER_MAX_PIXELS = 1024 * 1024
PROMPT_ROOM = 4096  # bytes of JSON-escaped prompt per image a body may carry
READERS = 2  # request bodies read (held in memory) at once
MAX_CONNECTIONS = 64
UNAUTHENTICATED_SHARE = 2  # unauthenticated connections hold at most 1/2 of max_connections ...
ADDRESS_SHARE = 4  # ... and those of one address at most 1/4
HEADER_DEADLINE_S = 5.0  # a request's line and headers (its token) arrive within this ...
HEADER_LIMIT = 32 * 1024  # ... in at most this many bytes
REQUEST_GRACE_S = 5.0  # a body gets this ...
REQUEST_MIN_RATE = 1024 * 1024  # ... plus its declared length at this many bytes/s, and keeps on this schedule
RATE_WINDOW_S = 5.0  # checked every this many seconds after the grace
REQUEST_MAX_S = 300.0  # and at most this, or the largest allowed body's time at the rate floor if longer
LOGGED_CHARS = 200  # a client's text (path, error) is cut to this many characters in the log
LOG_EVERY_S = 10.0  # a kind of line about clients without the token: at most once per address per this many seconds
LOG_ADDRESSES = 4096  # addresses whose last such line is remembered at once


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


def log_client(client: Any, text: str) -> None:
    """One line on stderr for a client: never a header (they carry the token); its text cut short, its
    control characters escaped; never waiting on stderr (:func:`write_log`)."""
    write_log(f"serve-reward: {_host(client)} {_logged(text)}\n")


def _logged(text: str) -> str:
    return server_text(" ".join(str(text).split()), LOGGED_CHARS)


def write_log(text: str) -> None:
    """Write ``text`` (a line or a few, under 4 KiB: one write a pipe takes whole) to stderr, unless stderr
    would make the writer wait (a pipe nobody reads, a terminal on hold): then it is dropped and counted,
    and the next text written says how many were. No thread of the server waits on its log: 64 sockets
    without a token, reopened as fast as the server closed them, filled a pipe nobody read with their
    lines, and every thread that logged, the accepting one among them, waited; every request timed out."""
    stream = sys.stderr
    with _LOG_LOCK:
        if not _writable(stream):
            _LOG_DROPPED[0] += 1
            return
        if _LOG_DROPPED[0]:
            text = f"serve-reward: {_LOG_DROPPED[0]} log lines left out (stderr was not being read)\n{text}"
            _LOG_DROPPED[0] = 0
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # stderr closed
            pass


_LOG_LOCK = threading.Lock()  # one writer at a time: a write that found room is the only one
_LOG_DROPPED = [0]  # lines left out since the last one written


def _writable(stream: Any) -> bool:
    """Whether ``stream`` takes a write of up to 4 KiB now without waiting (a pipe with a free page: POLLOUT);
    True for a stream without a descriptor (a test's capture)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))


class ClientLog:
    """A server's lines about clients without the token (connections closed to make room, refusals before
    authentication): each ``kind`` of them written at most once per ``every`` seconds per address, the next
    one saying how many were left out since, so that a flood of sockets writes a line per address every few
    seconds, not one per socket."""

    def __init__(self, every: float = LOG_EVERY_S) -> None:
        self.every = every
        self.lock = threading.Lock()
        self.last: dict[tuple[str, str], list] = {}  # (address, kind) -> [when written, lines left out since]

    def line(self, client: Any, text: str, kind: str) -> None:
        key, now = (_host(client), kind), time.monotonic()
        with self.lock:
            seen = self.last.get(key)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return
            if len(self.last) >= LOG_ADDRESSES:  # forget the quiet ones (a flood from many addresses)
                self.last = {k: v for k, v in self.last.items() if now - v[0] < self.every}
            self.last[key] = [now, 0]
        more = f" (and {seen[1]} more like it in {now - seen[0]:.0f} s)" if seen is not None and seen[1] else ""
        write_log(f"serve-reward: {key[0]} {_logged(text)}{more}\n")


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
        self.log = ClientLog()

    def enter(self, sock: socket.socket, client: Any) -> bool:
        """Count ``sock`` (from ``client``) as unauthenticated from now on, making room as needed;
        False when every other connection is authenticated and the limit is reached."""
        host = _host(client)
        closed: list[tuple[Any, str]] = []  # logged once the lock is let go
        try:
            with self.lock:
                self.authenticated.discard(sock)
                self.waiting.pop(sock, None)
                while True:
                    mine = [s for s, w in self.waiting.items() if _host(w.client) == host]
                    full = (len(self.waiting) >= self.unauthenticated
                            or len(self.waiting) + len(self.authenticated) >= self.limit)
                    if len(mine) >= self.per_address:
                        closed.append((self._close(self._victim(mine)), f"{self.per_address} from one address"))
                    elif full and self.waiting:
                        closed.append((self._close(self._victim(self._of_busiest_address())),
                                       f"{self.unauthenticated} in all"))
                    elif full:
                        return False
                    else:
                        self.waiting[sock] = _Waiting(client)
                        return True
        finally:
            for gone, cap in closed:
                self.log.line(gone, "closed: no authenticated request yet, to make room for a new connection "
                                    f"(unauthenticated connections: at most {cap})", "room")

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

    def is_authenticated(self, sock: socket.socket) -> bool:
        with self.lock:
            return sock in self.authenticated

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

    def _close(self, sock: socket.socket) -> Any:
        """Close an unauthenticated connection to make room (under the lock); its client, for the log."""
        client = self.waiting.pop(sock).client
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return client

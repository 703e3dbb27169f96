"""One HTTP exchange with a deadline for the whole of it and a cap on the answer's size: every request of
check-setting's and serve-judges' server checks (``setting/environment.py``) and of the remote scorers and
judges (``NAME@URL``, the chat judges, geneval: ``transport.request``) is one :func:`exchange`.

A socket timeout bounds each read, not the request: a server that declares ``Content-Length: 100`` and then
sends one byte every 3 s kept ``serve-judges`` waiting past 90 s. Here the connection, the request, the
answer's head and its body share one deadline: the socket's timeout is the time left, and a timer shuts
the socket down at the deadline, whatever it waits for (http.client reads the head line by line). The
body is read in chunks up to ``max_bytes``; a larger declared length is refused before any of it is read.
Plain ``http.client``: no proxy discovery. A server's text shown to the user goes through
:func:`server_text` (control characters escaped: an ESC colour sequence is shown, not obeyed).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from recast_cli.artifacts.jsonio import MAX_JSON_DEPTH, json_loads
from recast_cli.errors import BadInput, shown

#: Bytes read from the socket at a time: the deadline and the cap are checked between reads.
CHUNK = 64 * 1024


class NoAnswer(Exception):
    """No complete answer: refused, reset, cut short, or past the deadline (``str``: why, in a few words)."""


class AnswerTooLarge(NoAnswer):
    """An answer over its size cap: the server's doing, not the network's (a caller does not retry it)."""


def url_problem(url: object) -> str | None:
    """None for an http(s) URL with a host and a port in 1..65535 (or none: the scheme's), else what is wrong
    with it, in a few words (``urlsplit`` and http.client raise ValueError on these only when used)."""
    if not isinstance(url, str):
        return "is not a string"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return "has a port that is not a number in 1..65535" if "Port" in str(exc) else "is not a well-formed URL"
    if parts.scheme not in ("http", "https"):
        return "is not an http(s) URL"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "has a port that is not a number in 1..65535"
    return None


def server_text(value: object, limit: int = 200) -> str:
    """Text a server sent, as a message may show it: cut to ``limit`` characters (as ``errors.cut`` does),
    every character that is not printable escaped (``\\x1b``: a terminal shows it instead of obeying it);
    not a string: its repr, cut (``errors.shown``)."""
    if not isinstance(value, str):
        return shown(value, limit)
    head = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in value[:limit])
    return head if len(value) <= limit else f"{head}… ({len(value) - limit} more characters)"


def json_of(body: bytes, where: str) -> Any:
    """An answer's ``body`` as JSON, through the bounded reader (``jsonio.json_loads``): BadInput
    "``where`` is JSON nested deeper than …" before the parser sees it (a RecursionError else); ValueError
    when it is not JSON (the caller words it)."""
    try:
        return json_loads(body, where)
    except BadInput:
        raise BadInput(f"{where} is JSON nested deeper than {MAX_JSON_DEPTH} levels") from None


def exchange(url: str, method: str = "GET", path: str = "", body: bytes | None = None,
             headers: dict[str, str] | None = None, *, seconds: float, max_bytes: int,
             read_body: bool = True) -> tuple[int, bytes]:
    """(status, body) of one ``method`` request to ``url`` + ``path``, all of it within ``seconds``; the body
    at most ``max_bytes`` (AnswerTooLarge), not read at all when not ``read_body`` (any answer will do).
    NoAnswer when none came whole in time; BadInput for a malformed ``url``."""
    why = url_problem(url)
    if why is not None:
        raise BadInput(f"{shown(url)} {why}")
    parts = urlsplit(url)
    target = (parts.path.rstrip("/") + path) or "/"
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + seconds
    watch = _Watch(conn_cls(parts.hostname, parts.port, timeout=seconds))
    timer = threading.Timer(seconds, watch.cut)
    timer.daemon = True
    timer.start()
    try:
        watch.conn.request(method, target, body=body, headers=dict(headers or {}))
        watch.sock = watch.conn.sock  # kept: http.client lets go of it on an answer that closes the connection
        response = watch.response = watch.conn.getresponse()
        if watch.cut_off:  # a head cut short at the deadline parses as one without its last headers
            raise TimeoutError
        if not read_body:
            return response.status, b""
        if response.length is not None and response.length > max_bytes:
            raise AnswerTooLarge(f"answered {response.length} bytes, more than the {max_bytes} allowed")
        data = bytearray()
        while chunk := watch.read(response, deadline):
            data += chunk
            if len(data) > max_bytes:
                raise AnswerTooLarge(f"answered more than the {max_bytes} bytes allowed")
        if watch.cut_off:  # a body read until the connection closes ends where the deadline cut it
            raise TimeoutError
        if response.length:  # the connection closed before the declared length (read1 does not say)
            raise http.client.IncompleteRead(bytes(data), response.length)
        return response.status, bytes(data)
    except AnswerTooLarge:
        raise
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
        if watch.cut_off or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
            raise NoAnswer("timed out") from None
        raise NoAnswer("refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__) from None
    finally:
        timer.cancel()
        watch.close()


class _Watch:
    """One exchange's connection and socket, for its deadline's timer."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn, self.sock, self.cut_off = conn, None, False
        self.response: http.client.HTTPResponse | None = None

    def read(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        """The next chunk of the body (b"" at its end), the socket waiting at most until ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if self.sock is not None:
            self.sock.settimeout(left)
        return response.read1(CHUNK)

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
        self.conn.close()

    def cut(self) -> None:
        """The deadline: shut the socket down, so that whatever read or write waits on it returns at once."""
        self.cut_off = True
        sock = self.sock or self.conn.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
            except OSError:
                pass

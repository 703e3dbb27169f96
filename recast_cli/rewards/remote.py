"""Process isolation for scorers: ``recast serve-reward`` (server) and ``RemoteScorer`` (client).

Protocol ``recast.reward/1`` (JSON over HTTP; images as base64 PNG; never pickle):

* ``GET /v1/info`` → ``{"protocol": "recast.reward/1", "scorer": NAME, "output_range": [lo, hi]}``
  (an infinite bound is ``null``).
* ``POST /v1/score`` with ``{"prompts": [str, ...], "images": [base64 PNG, ...]}`` →
  ``{"scores": [float, ...], "extras": {column: [value, ...]}}``, one entry per image.
* Every request carries ``Authorization: Bearer TOKEN`` when the server has a token;
  a wrong or missing token is HTTP 401. A request the scorer rejects (BadInput) is 400 with
  ``{"error": "one line"}``; an internal failure is 500 (and is retried by the client).

The server binds 127.0.0.1 unless told otherwise and scores one request at a time. Its limits
are derived from the batch it accepts: at most ``max_batch`` images of at most ``max_pixels``
pixels each (checked from each PNG's header before decoding: 413), a body of at most
``body_limit(max_batch, max_pixels)`` bytes (413), at most ``readers`` bodies read at once (503
when busy). Hostile or broken clients cannot starve the others:

* every request (request line, headers and body together) must arrive before its deadline,
  ``REQUEST_GRACE_S`` plus one second per ``REQUEST_MIN_RATE`` bytes received so far (see
  ``RequestReader``): a client trickling bytes is answered 408 and closed after about the grace,
  whatever it sends, and loses its reader slot, while an upload faster than the minimum rate
  never runs out of time;
* at most ``MAX_CONNECTIONS`` connections (one thread each) are open at once; one more is
  answered 503 from the accepting thread and closed;
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
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
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
MAX_BATCH = 64
SERVER_MAX_PIXELS = 1024 * 1024
SOCKET_TIMEOUT_S = 30.0  # writing a reply, and waiting for a reader slot
READERS = 2
MAX_CONNECTIONS = 64
REQUEST_GRACE_S = 10.0  # a request's deadline: this many seconds ...
REQUEST_MIN_RATE = 64 * 1024  # ... plus one second per this many bytes received so far
LOGGED_CHARS = 200  # a client's text (path, error) is cut to this many characters in the log


def body_limit(max_batch: int = MAX_BATCH, max_pixels: int = SERVER_MAX_PIXELS) -> int:
    """The largest request body a server with these limits can need: ``max_batch`` base64 PNGs of
    ``max_pixels`` RGB pixels each (stored uncompressed in the worst case), plus the prompts."""
    png = 3 * max_pixels + 1024 * (1 + max_pixels // (1 << 16))  # raw RGB + chunk and filter overhead
    return max_batch * (4 * (png + 2) // 3 + 4096) + (1 << 16)


def _range_to_json(bounds: tuple[float, float]) -> list[float | None]:
    return [b if math.isfinite(b) else None for b in bounds]


def _range_from_json(value: Any) -> tuple[float, float]:
    lo, hi = value
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


class RequestDeadline(Exception):
    """A request did not arrive before its deadline (``RequestReader``); the server answers 408."""


class RequestReader(io.RawIOBase):
    """The read side of one connection, with one deadline per request.

    A request (request line, headers and body together) gets ``grace`` seconds plus one second
    per ``min_rate`` bytes received so far: a slow-loris client trickling bytes runs out of time
    after about ``grace`` seconds whatever it sends, while an honest upload faster than
    ``min_rate`` bytes/s never does, however large. A per-read timeout bounds neither. The
    socket's own timeout is set to what is left before each read and restored to
    ``write_timeout`` (for replies) after it.
    """

    def __init__(self, sock: socket.socket, grace: float, min_rate: float, write_timeout: float) -> None:
        super().__init__()
        self.sock, self.grace, self.min_rate, self.write_timeout = sock, grace, min_rate, write_timeout
        self.begin()

    def begin(self) -> None:
        """A new request starts now (the wait for it on a kept-alive connection counts against it)."""
        self.started = time.monotonic()
        self.received = 0

    def excuse(self, seconds: float) -> None:
        """Do not count ``seconds`` against the request (the server kept it waiting, not the client)."""
        self.started += seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.started + self.grace + self.received / self.min_rate - time.monotonic()
        if left <= 0:
            raise self._late()
        self.sock.settimeout(left)
        try:
            count = self.sock.recv_into(buffer)
        except TimeoutError:
            raise self._late() from None
        finally:
            self.sock.settimeout(self.write_timeout)
        self.received += count
        return count

    def _late(self) -> RequestDeadline:
        return RequestDeadline(f"{self.received} bytes in {time.monotonic() - self.started:.1f} s; a request gets "
                               f"{self.grace:g} s plus 1 s per {self.min_rate / 1024:g} KiB")


def _log(client: Any, text: str) -> None:
    """One line on stderr for a client: never a header (they carry the token); its text cut short."""
    text = " ".join(str(text).split())
    if len(text) > LOGGED_CHARS:
        text = text[:LOGGED_CHARS] + "..."
    host = client[0] if isinstance(client, tuple) and client else "?"
    sys.stderr.write(f"serve-reward: {host} {text}\n")


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
    once, so a flood of connections cannot create threads without bound: one more is answered 503
    by the accepting thread and closed (clients retry 503)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int = MAX_CONNECTIONS) -> None:
        self.max_connections = max_connections
        self._open = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._open.acquire(blocking=False):
            _log(client_address, f"refused: the limit of {self.max_connections} open connections is reached (503)")
            _raw_reply(request, 503, f"busy: the limit of {self.max_connections} open connections is reached; retry")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._open.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._open.release()


def make_server(scorer: Scorer, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                max_batch: int = MAX_BATCH, max_pixels: int = SERVER_MAX_PIXELS, timeout: float = SOCKET_TIMEOUT_S,
                readers: int = READERS, max_connections: int = MAX_CONNECTIONS, grace: float = REQUEST_GRACE_S,
                min_rate: float = REQUEST_MIN_RATE) -> RewardServer:
    """A reward server for ``scorer`` bound to (host, port); port 0 picks a free one. Not started.

    ``timeout`` bounds writing a reply and waiting for a reader slot; ``grace`` and ``min_rate``
    set each request's deadline (``RequestReader``); ``max_connections`` caps open connections.
    """
    from recast_cli.images import ImageTooLarge

    lock = threading.Lock()  # scorers hold one model each: score one request at a time
    reading = threading.BoundedSemaphore(readers)  # bodies in memory at once
    expected = token.encode() if token else None
    max_body = body_limit(max_batch, max_pixels)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            self.timeout = timeout  # the socket's timeout between reads: writing a reply
            super().setup()
            self.rfile.close()  # every read goes through the request's deadline instead
            self.reader = RequestReader(self.connection, grace, min_rate, timeout)
            self.rfile = io.BufferedReader(self.reader)
            self.served = 0

        def handle_one_request(self) -> None:
            self.reader.begin()
            try:
                super().handle_one_request()
                self.served += 1
            except RequestDeadline as exc:
                self.close_connection = True
                if self.served and not self.reader.received:
                    return  # a kept-alive connection left idle: closed without a word
                _log(self.client_address, f"request not received in time ({exc}): 408, closed")
                _raw_reply(self.connection, 408, f"request not received in time ({exc})")
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
            if expected is None:
                return True
            scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
                return True
            self.close_connection = True
            self._send(401, {"error": "wrong or missing token"})
            return False

        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path != "/v1/info":
                self._send(404, {"error": f"no such endpoint {self.path}"})
                return
            self._send(200, {"protocol": PROTOCOL, "scorer": scorer.name,
                             "output_range": _range_to_json(scorer.output_range)})

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
            error is sent. A slot is waited for at most ``timeout`` (503), and the wait does not count
            against the request's deadline; a late body raises RequestDeadline (408)."""
            waited = time.monotonic()
            if not reading.acquire(timeout=timeout):
                self.close_connection = True
                self._send(503, {"error": "busy: too many requests being read; retry"})
                return None
            self.reader.excuse(time.monotonic() - waited)
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

    return RewardServer((host, port), Handler, max_connections)


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
          max_pixels: int = SERVER_MAX_PIXELS, max_connections: int = MAX_CONNECTIONS) -> None:
    """Serve ``scorer`` until interrupted. Without a token only a loopback host is allowed."""
    if token is None and host not in LOOPBACK:
        raise BadInput(f"serve-reward: binding {host} needs a token (--token or ${TOKEN_ENV})")
    if max_batch < 1 or max_pixels < 1 or max_connections < 1:
        raise BadInput("serve-reward: --max-batch, --max-pixels and --max-connections must be >= 1")
    try:
        server = make_server(scorer, host, port, token, max_batch=max_batch, max_pixels=max_pixels,
                             max_connections=max_connections)
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
    defaults to ``$RECAST_REWARD_TOKEN``. Requests go in batches of ``batch_size`` images,
    each with ``timeout`` seconds and up to ``retries`` tries (backoff doubling from ``backoff``).
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

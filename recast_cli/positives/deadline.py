"""One deadline for a whole image-API request and a cap on its answer's bytes, for the SDK sources
(``openai_images``, ``gemini_images``): what ``rewards/exchange.py`` is for recast's own requests.

The SDKs' timeouts (httpx2's) bound each read, not the request: a server that sends its head or its body one
byte every few seconds held a request, and a worker thread of :mod:`.api`'s pool, for as long as it liked,
and an answer's size had no bound (nor, gzip-encoded, its decoded size). Here :func:`call` runs one SDK call
with a deadline kept for the thread; the SDK's httpx2 client (:func:`client`) reaches the network through
:class:`_Stream`, whose every wait (connect, TLS, each write and read) is cut to the time left, and its
transport reads the whole answer within the deadline, counting the bytes as sent and as decoded up to
:data:`MAX_ANSWER_BYTES`. Past the deadline: :class:`.api.PastDeadline` (transient: retried like a
timeout); over the cap: :class:`.api.AnswerTooLarge` (permanent); a body that is not what its encoding says:
:class:`.api.Transient`. The client is built as httpx2 builds its
default one (proxies from the environment, ``trust_env``); only its connection pools' network backend
differs. Name resolution is not bounded (as in ``exchange``): it happens before a socket exists.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpcore2
import httpx2

from recast_cli.positives.api import AnswerTooLarge, PastDeadline, Transient

#: The most bytes one answer may hold, as sent and as decoded: one generated image as base64 in JSON. The
#: sizes recast asks for (GPT Image at most 1536×1024, Gemini's 1K–2K) are a few MiB of PNG, 4/3 of that as
#: base64; even a 4096×4096 PNG fits at any compression a real image has. A larger answer is not an image's.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The answer encodings the client asks for; the transport decodes these itself, within the cap.
ENCODINGS = "gzip, deflate"

T = TypeVar("T")
_local = threading.local()


@dataclass
class _Limits:
    """One request's deadline (``time.monotonic``), its cap, and what stopped it (set where it happened)."""

    deadline: float
    seconds: float
    max_bytes: int
    problem: Exception | None = None

    def late(self) -> PastDeadline:
        self.problem = self.problem or PastDeadline(f"no whole answer within {self.seconds:g} s (--timeout)")
        return self.problem

    def broken(self, why: str) -> Transient:
        self.problem = Transient(why)
        return self.problem

    def too_large(self, what: str) -> AnswerTooLarge:
        self.problem = AnswerTooLarge(f"the answer {what} the {self.max_bytes / 2**20:g} MiB one image's answer "
                                      "may hold")
        return self.problem


def call(send: Callable[[], T], seconds: float, max_bytes: int = MAX_ANSWER_BYTES) -> T:
    """``send()`` (one SDK request through a :func:`client`) with ``seconds`` for the whole of it and answers
    of at most ``max_bytes``; PastDeadline or AnswerTooLarge when either stopped it, however the SDK wrapped
    the transport's error; the SDK's own errors else."""
    limits = _local.limits = _Limits(time.monotonic() + seconds, seconds, max_bytes)
    try:
        return send()
    except Exception:
        if limits.problem is not None:
            raise limits.problem from None
        raise
    finally:
        _local.limits = None


def client(**options: Any) -> httpx2.Client:
    """An httpx2 client for an SDK (``follow_redirects`` as the SDKs set it; ``options`` as httpx2.Client's)
    whose requests made inside :func:`call` keep its deadline and cap; outside one it is a plain client."""
    headers = {"Accept-Encoding": ENCODINGS, **options.pop("headers", {})}
    return _Client(follow_redirects=True, headers=headers, **options)


def _wait(timeout: float | None, late: type[Exception]) -> tuple[float | None, _Limits | None]:
    """The timeout for one wait on the network (``timeout``, cut to the time left) and the request's limits,
    or ``late`` raised when the deadline has passed (no request in progress: ``timeout`` as given)."""
    limits = getattr(_local, "limits", None)
    if limits is None:
        return timeout, None
    left = limits.deadline - time.monotonic()
    if left <= 0:
        limits.late()
        raise late("the request's deadline has passed")
    return (left if timeout is None else min(timeout, left)), limits


def _bounded(operation: Callable[..., T], *args: Any, timeout: float | None, late: type[Exception]) -> T:
    """``operation(*args, timeout=…)`` waiting at most until the deadline; a timeout that was the deadline's
    is recorded as the request's problem."""
    wait, limits = _wait(timeout, late)
    try:
        return operation(*args, timeout=wait)
    except httpcore2.TimeoutException:
        if limits is not None and (timeout is None or wait < timeout):
            limits.late()
        raise


class _Stream(httpcore2.NetworkStream):
    """A connection whose every wait ends by the request's deadline."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _bounded(self.inner.read, max_bytes, timeout=timeout, late=httpcore2.ReadTimeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _bounded(self.inner.write, buffer, timeout=timeout, late=httpcore2.WriteTimeout)

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        return _Stream(_bounded(self.inner.start_tls, ssl_context, server_hostname, timeout=timeout,
                                late=httpcore2.ConnectTimeout))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _Backend(httpcore2.NetworkBackend):
    """httpcore2's network backend, its connections wrapped in :class:`_Stream`."""

    def __init__(self, inner: httpcore2.NetworkBackend) -> None:
        self.inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore2.NetworkStream:
        return self._connect(self.inner.connect_tcp, host, port, timeout=timeout, local_address=local_address,
                             socket_options=socket_options)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options=None) -> httpcore2.NetworkStream:
        return self._connect(self.inner.connect_unix_socket, path, timeout=timeout, socket_options=socket_options)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    @staticmethod
    def _connect(connect: Callable[..., httpcore2.NetworkStream], *args: Any, timeout: float | None,
                 **options: Any) -> httpcore2.NetworkStream:
        def opened(*positional: Any, timeout: float | None) -> httpcore2.NetworkStream:
            return connect(*positional, timeout=timeout, **options)

        return _Stream(_bounded(opened, *args, timeout=timeout, late=httpcore2.ConnectTimeout))


class _Transport(httpx2.HTTPTransport):
    """httpx2's transport (its pool, TLS and proxy handling as they are) that reaches the network through
    :class:`_Backend` and, inside :func:`call`, hands the client an answer already read whole and decoded."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        pool = self._pool  # httpcore2's pools take a network_backend; httpx2's transport passes none
        if not isinstance(getattr(pool, "_network_backend", None), httpcore2.NetworkBackend):
            raise RuntimeError(f"httpx2 {httpx2.__version__}: its connection pool has no network backend to wrap")
        pool._network_backend = _Backend(pool._network_backend)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        limits = getattr(_local, "limits", None)
        if limits is None:
            return super().handle_request(request)
        left = max(0.0, limits.deadline - time.monotonic())  # the wait for a free connection, too
        timeouts = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {name: left if timeouts.get(name) is None else min(timeouts[name], left)
                                         for name in ("connect", "read", "write", "pool")}
        response = super().handle_request(request)
        try:
            body = _body(response, limits)
        finally:
            response.close()
        headers = [(name, value) for name, value in response.headers.raw
                   if name.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")]
        return httpx2.Response(response.status_code, headers=headers, content=body, extensions=response.extensions)


def _body(response: httpx2.Response, limits: _Limits) -> bytes:
    """The whole body of ``response`` as decoded (gzip and deflate here, within the cap), read within the
    deadline; AnswerTooLarge past the cap, as declared, sent or decoded; Transient for a body that is not
    what its encoding says (a broken answer)."""
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise limits.too_large(f"declares {int(declared)} bytes, more than")
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        raise limits.broken(f"the answer is in content encoding {encoding[:40]!r}, which was not asked for")
    decoder = None if encoding in ("", "identity") else zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip
    sent, data = 0, bytearray()
    for chunk in response.stream:
        sent += len(chunk)
        if sent > limits.max_bytes:
            raise limits.too_large("is longer than")
        if decoder is None:
            data += chunk
        else:  # decoded no further than one byte past the cap: a gzip bomb stops there
            try:
                data += decoder.decompress(chunk, limits.max_bytes + 1 - len(data))
            except zlib.error as exc:
                raise limits.broken(f"the answer does not decode as {encoding} ({exc})") from None
            if len(data) > limits.max_bytes:
                raise limits.too_large("decodes to more than")
        if time.monotonic() >= limits.deadline:
            raise limits.late()
    return bytes(data)


class _Client(httpx2.Client):
    """httpx2.Client whose own transport and proxy transports (from the environment or given) are
    :class:`_Transport`."""

    def _init_transport(self, transport: httpx2.BaseTransport | None = None, **options: Any) -> httpx2.BaseTransport:
        return transport if transport is not None else _Transport(**options)

    def _init_proxy_transport(self, proxy: httpx2.Proxy, **options: Any) -> httpx2.BaseTransport:
        return _Transport(proxy=proxy, **options)

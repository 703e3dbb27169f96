"""HTTP for the remote scorers: bounded timeouts, retries with exponential backoff, PNG encoding.

Plain ``http.client`` (no proxy discovery, no extra dependency). Connection failures,
timeouts and 429/5xx answers are retried; other answers are returned to the caller, which
knows what they mean. Secrets travel in headers and never appear in an error message.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from PIL import Image

from recast_cli import bounds
from recast_cli.errors import BadInput

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call: base URL, per-request timeout (s), tries, first backoff (s, doubling)."""

    url: str
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInput(f"{self.url!r} is not an http(s) URL")
        if not (self.timeout > 0 and self.backoff >= 0):
            raise BadInput(f"{self.url}: timeout must be > 0 and backoff >= 0")
        bounds.check("tries", self.retries, f"{self.url}: retries")


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def json(self, what: str) -> Any:
        """The body as JSON; BadInput naming ``what`` if it is not."""
        try:
            return json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadInput(f"{what}: the server sent a malformed reply (not JSON, HTTP {self.status})") from None


def request(endpoint: Endpoint, method: str, path: str, what: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Reply:
    """One HTTP exchange with retries; BadInput once every try failed to get an answer."""
    parts = urlsplit(endpoint.url)
    target = (parts.path.rstrip("/") + path) or "/"
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    last = ""
    for attempt in range(endpoint.retries):
        if attempt:
            time.sleep(endpoint.backoff * 2 ** (attempt - 1))
        conn = conn_cls(parts.hostname, parts.port, timeout=endpoint.timeout)
        try:
            conn.request(method, target, body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            reply = Reply(response.status, response.read())
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
            last = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else type(exc).__name__
            continue
        finally:
            conn.close()
        if reply.status not in RETRY_STATUSES:
            return reply
        last = f"HTTP {reply.status}"
    raise BadInput(f"{what}: {endpoint.url} unreachable after {endpoint.retries} tries (last: {last})")


def png_base64(image: Image.Image) -> str:
    """Lossless PNG bytes of ``image``, base64 text (the safe wire encoding: no pickle)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png_base64(text: Any, what: str, max_pixels: int | None = None) -> Image.Image:
    """An RGB image from base64 PNG text; BadInput for anything else, ImageTooLarge (a BadInput)
    when its header declares more than ``max_pixels`` pixels (checked before decoding)."""
    from recast_cli.images import ImageTooLarge, read_image

    try:
        raw = base64.b64decode(text, validate=True)
    except (TypeError, ValueError):
        raise BadInput(f"{what}: an image is not base64-encoded PNG") from None
    try:
        image = read_image(raw, f"{what}: an image", max_pixels, formats=("PNG",))
    except ImageTooLarge:
        raise
    except BadInput:
        raise BadInput(f"{what}: an image is not base64-encoded PNG") from None
    return image.convert("RGB")

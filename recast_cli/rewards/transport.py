"""HTTP for the remote scorers: one deadline per try, a capped answer, retries with exponential backoff,
PNG encoding.

Each try is one ``exchange`` (``rewards/exchange.py``): connecting, sending and the whole answer within
the endpoint's ``timeout`` (a server that trickles its answer is cut there), an answer of at most
``ANSWER_LIMIT`` bytes (more is BadInput at once, not retried), read as JSON with its nesting bounded.
Connection failures, timeouts and 429/5xx answers are retried; other answers are returned to the
caller, which knows what they mean. Secrets travel in headers and never appear in an error message.
"""

from __future__ import annotations

import base64
import io
import math
import time
from dataclasses import dataclass
from typing import Any

from PIL import Image

from recast_cli import bounds
from recast_cli.errors import BadInput, shown
from recast_cli.rewards.exchange import AnswerTooLarge, NoAnswer, exchange, json_of, url_problem

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The most bytes of one answer: a reply of scores and extras, or a chat message, is kilobytes.
ANSWER_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call: base URL, seconds one try may take in all, tries, first backoff (s, doubling)."""

    url: str
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        why = url_problem(self.url)
        if why is not None:
            raise BadInput(f"{shown(self.url)} {why}")
        if not (0 < self.timeout < math.inf and self.backoff >= 0):
            raise BadInput(f"{self.url}: timeout must be > 0 and backoff >= 0")
        bounds.check("tries", self.retries, f"{self.url}: retries")


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def json(self, what: str) -> Any:
        """The body as JSON, its nesting bounded (``exchange.json_of``); BadInput naming ``what`` if it is not."""
        try:
            return json_of(self.body, f"{what}: the server's reply")
        except BadInput:  # nested too deeply
            raise
        except ValueError:  # not JSON, or not UTF-8
            raise BadInput(f"{what}: the server sent a malformed reply (not JSON, HTTP {self.status})") from None


def request(endpoint: Endpoint, method: str, path: str, what: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Reply:
    """One HTTP exchange with retries, each try within ``endpoint.timeout``; BadInput once every try failed to
    get an answer, or at once for an answer over ``ANSWER_LIMIT`` bytes."""
    last = ""
    for attempt in range(endpoint.retries):
        if attempt:
            time.sleep(endpoint.backoff * 2 ** (attempt - 1))
        try:
            reply = Reply(*exchange(endpoint.url, method, path, body, headers, seconds=endpoint.timeout,
                                    max_bytes=ANSWER_LIMIT))
        except AnswerTooLarge as exc:
            raise BadInput(f"{what}: {endpoint.url} {exc}") from None
        except NoAnswer as exc:  # refused, reset, timed out, cut short
            last = str(exc)
            continue
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

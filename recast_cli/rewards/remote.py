"""The reward protocol ``recast.reward/1`` and its client, ``RemoteScorer`` (a scorer named ``NAME@URL``).

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

The server, ``recast serve-reward``, is ``rewards/server.py``; its limits against idle, slow
and hostile clients are ``rewards/serve_limits.py``'s.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from recast_cli.errors import BadInput, shown
from recast_cli.rewards.base import Images, Scorer, as_pil, check_batch, check_batch_size, chunks
from recast_cli.rewards.exchange import server_text
from recast_cli.rewards.transport import Endpoint, png_base64, request

PROTOCOL = "recast.reward/1"
TOKEN_ENV = "RECAST_REWARD_TOKEN"


def range_to_json(bounds: tuple[float, float]) -> list[float | None]:
    """An output range as the protocol sends it: an infinite bound is ``null``."""
    return [b if math.isfinite(b) else None for b in bounds]


def range_from_json(value: Any) -> tuple[float, float]:
    """An output range as the protocol sent it (``null``: infinite); malformed raises TypeError or ValueError."""
    lo, hi = value
    return (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi))


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
            raise BadInput(f"{name}: the server at {url} serves {shown(info.get('scorer'))}, not {name!r}")
        self.name = str(info.get("scorer"))
        try:
            self.output_range = range_from_json(info.get("output_range"))
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
            raise BadInput(f"{self.name}: {self.endpoint.url} answered HTTP {reply.status}: "
                           f"{server_text(error) if error else 'no reason'}")
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

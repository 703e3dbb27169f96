"""A minimal OpenAI-compatible chat client (vLLM, SGLang, ...) for the VLM scorers and the pairwise judge.

``POST {url}/chat/completions`` with ``{"model", "messages", "temperature": 0, "max_tokens"}``;
images go inline as ``data:image/png;base64,…`` URLs. The API key, when the endpoint needs
one, comes from the environment (``RECAST_VLM_API_KEY``) or a flag, never from a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from PIL import Image

from recast_cli import bounds
from recast_cli.errors import BadInput
from recast_cli.rewards.exchange import server_text
from recast_cli.rewards.transport import Endpoint, png_base64, request

API_KEY_ENV = "RECAST_VLM_API_KEY"
T = TypeVar("T")
U = TypeVar("U")


def image_part(image: Image.Image) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_base64(image)}"}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


class ChatClient:
    """Sends one user message per call and returns the reply text; ``map`` runs calls concurrently."""

    def __init__(self, url: str, model: str, what: str, api_key: str | None = None, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, max_tokens: int = 512, concurrency: int = 8) -> None:
        self.endpoint = Endpoint(url, float(timeout), int(retries), float(backoff))
        self.model, self.what = model, what
        self.max_tokens = int(max_tokens)
        self.concurrency = bounds.check("concurrency", concurrency, f"{what}: concurrency")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def ask(self, content: Sequence[dict[str, Any]]) -> str:
        """The reply text to one user message made of text and image parts."""
        body = json.dumps({"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                           "messages": [{"role": "user", "content": list(content)}]}).encode()
        reply = request(self.endpoint, "POST", "/chat/completions", self.what, body, self._headers)
        if reply.status in (401, 403):
            raise BadInput(f"{self.what}: {self.endpoint.url} refused the API key (set ${API_KEY_ENV})")
        data = reply.json(self.what)
        if reply.status != 200:
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            raise BadInput(f"{self.what}: {self.endpoint.url} answered HTTP {reply.status}: "
                           f"{server_text(message) if message else 'no reason'}")
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise BadInput(f"{self.what}: {self.endpoint.url} sent a reply without choices[0].message.content") from None
        if isinstance(text, list):  # some servers answer with content parts
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        if not isinstance(text, str):
            raise BadInput(f"{self.what}: {self.endpoint.url} sent a non-text message content")
        return text

    def map(self, fn: Callable[[T], U], items: Sequence[T]) -> list[U]:
        """``[fn(x) for x in items]`` with up to ``concurrency`` requests in flight, order kept."""
        if self.concurrency == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(fn, items))

"""Source ``gemini``: Google's image generation through the ``google-genai`` SDK (the paper's Nano Banana Pro).

docs/method.md §4, "Positive samples" (E2): the paper's second surrogate, used to check how much the
gains depend on the generator (``recast compare-gains``). ``generate_content`` with image
output; the key comes from ``GEMINI_API_KEY`` (or ``GOOGLE_API_KEY``), the endpoint from
``GOOGLE_GEMINI_BASE_URL`` (default: Google's), both from the environment only. The SDK's
retries are off; :mod:`.api` retries. Its httpx2 client is :func:`.deadline.client` (one
deadline per request, a cap on the answer). A blocked prompt (``promptFeedback.blockReason``), a
safety finish reason or an answer without an image is recorded as a refusal of the prompt.
"""

from __future__ import annotations

import json
import os
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.positives.api import ApiSource, Refused, RetryPolicy, Transient, endpoint

DEFAULT_MODEL = "gemini-3-pro-image-preview"


class GeminiSource(ApiSource):
    name = "gemini"
    key_vars = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

    def __init__(self, model: str | None = None, aspect_ratio: str | None = None, concurrency: int = 4,
                 retry: RetryPolicy = RetryPolicy()):
        super().__init__(model or DEFAULT_MODEL, concurrency, retry)
        from google import genai
        from google.genai import types

        from recast_cli.positives import deadline

        self.aspect_ratio = aspect_ratio
        self.base_url = os.environ.get("GOOGLE_GEMINI_BASE_URL") or None
        self.client = genai.Client(api_key=self.key, http_options=types.HttpOptions(
            base_url=self.base_url, timeout=int(retry.timeout * 1000),
            retry_options=types.HttpRetryOptions(attempts=1), httpx_client=deadline.client()))
        image = types.ImageConfig(aspect_ratio=aspect_ratio) if aspect_ratio else None
        self.config = types.GenerateContentConfig(response_modalities=["IMAGE"], image_config=image)

    def identity(self) -> dict[str, Any]:
        return {"kind": "gemini", "model": self.model, "aspect_ratio": self.aspect_ratio}

    def meta(self) -> dict[str, Any]:
        return {"endpoint": endpoint(self.base_url) or "https://generativelanguage.googleapis.com"}

    def request(self, prompt: str) -> bytes:
        import httpx2
        from google.genai import errors

        from recast_cli.positives import deadline

        try:
            answer = deadline.call(lambda: self.client.models.generate_content(
                model=self.model, contents=prompt, config=self.config), self.retry.timeout)
        except errors.APIError as exc:
            if exc.code == 429 or exc.code >= 500 or exc.code == 408:
                raise Transient(f"{exc.code} {exc.status}: {exc.message}") from None
            hint = " (check GEMINI_API_KEY)" if exc.code in (401, 403) else ""
            raise BadInput(f"gemini: {exc.code} {exc.status}: {exc.message}{hint}") from None
        except (httpx2.TransportError, json.JSONDecodeError, ValueError) as exc:
            raise Transient(f"{type(exc).__name__}: {exc}") from None
        feedback = answer.prompt_feedback
        if feedback is not None and feedback.block_reason is not None:
            raise Refused(f"blocked: {feedback.block_reason}")
        if not answer.candidates:
            raise Refused("no candidate in the answer")
        candidate = answer.candidates[0]
        parts = candidate.content.parts if candidate.content and candidate.content.parts else []
        for part in parts:
            if part.inline_data is not None and part.inline_data.data:
                return part.inline_data.data
        text = " ".join(p.text for p in parts if p.text).strip()
        reason = candidate.finish_reason
        if reason is not None and str(reason).endswith(("SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII",
                                                        "RECITATION", "NO_IMAGE", "IMAGE_OTHER")):
            raise Refused(f"finish reason {reason}" + (f": {text}" if text else ""))
        raise Refused(f"no image in the answer{': ' + text if text else ''}")

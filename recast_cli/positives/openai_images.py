"""Source ``openai``: an Images-API-compatible endpoint through the official ``openai`` SDK.

The paper's π⁺ surrogate is GPT Image 1.5 (docs/method.md §4, "Positive samples"; E2). The key comes
from ``OPENAI_API_KEY`` and the endpoint from ``OPENAI_BASE_URL`` (default: OpenAI's), both read
from the environment only. The SDK's own retries are off: :mod:`.api` retries 429, 5xx, timeouts
and broken answers itself, and records a content-policy refusal (``moderation_blocked``,
``content_policy_violation``) as a refusal of the prompt. The SDK's httpx2 client is
:func:`.deadline.client`: one deadline per request, a cap on the answer.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.positives.api import ApiSource, Refused, RetryPolicy, Transient, endpoint, retry_after

DEFAULT_MODEL = "gpt-image-1.5"
REFUSAL_CODES = ("moderation_blocked", "content_policy_violation")


class OpenAISource(ApiSource):
    name = "openai"
    key_vars = ("OPENAI_API_KEY",)

    def __init__(self, model: str | None = None, size: str | None = None, quality: str | None = None,
                 concurrency: int = 4, retry: RetryPolicy = RetryPolicy()):
        super().__init__(model or DEFAULT_MODEL, concurrency, retry)
        from openai import OpenAI

        from recast_cli.positives import deadline

        self.size = size
        self.quality = quality
        self.base_url = os.environ.get("OPENAI_BASE_URL") or None
        self.client = OpenAI(api_key=self.key, base_url=self.base_url, max_retries=0, timeout=retry.timeout,
                             http_client=deadline.client())

    def identity(self) -> dict[str, Any]:
        return {"kind": "openai", "model": self.model, "size": self.size, "quality": self.quality}

    def meta(self) -> dict[str, Any]:
        return {"endpoint": endpoint(self.base_url) or "https://api.openai.com/v1"}

    def request(self, prompt: str) -> bytes:
        import openai

        from recast_cli.positives import deadline

        options: dict[str, Any] = {"model": self.model, "prompt": prompt, "n": 1}
        if self.size:
            options["size"] = self.size
        if self.quality:
            options["quality"] = self.quality
        if self.model.startswith("dall-e"):
            options["response_format"] = "b64_json"  # GPT Image models always answer in base64
        try:
            answer = deadline.call(lambda: self.client.images.generate(**options), self.retry.timeout)
        except openai.BadRequestError as exc:
            if _error_code(exc.body) in REFUSAL_CODES:
                raise Refused(f"{_error_code(exc.body)}: {_message(exc)}") from None
            raise BadInput(f"openai: 400 {_message(exc)}") from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise BadInput(f"openai: {exc.status_code} {_message(exc)} (check OPENAI_API_KEY)") from None
        except (openai.RateLimitError, openai.InternalServerError) as exc:
            raise Transient(f"{exc.status_code} {_message(exc)}", retry_after(exc.response.headers)) from None
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in (408, 409):
                raise Transient(f"{exc.status_code} {_message(exc)}", retry_after(exc.response.headers)) from None
            raise BadInput(f"openai: {exc.status_code} {_message(exc)}") from None
        except (openai.APIConnectionError, openai.APIResponseValidationError, json.JSONDecodeError) as exc:
            raise Transient(f"{type(exc).__name__}: {exc}") from None
        data = answer.data[0].b64_json if answer.data else None
        if not data:
            raise Transient("the answer holds no b64_json image")
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise Transient("the answer's b64_json is not base64") from None


def _error_field(body: object, name: str) -> str | None:
    """A field of an OpenAI error body (``{"error": {...}}`` or the inner object)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get(name) is not None:
            return str(inner[name])
    return None


def _error_code(body: object) -> str | None:
    return _error_field(body, "code")


def _message(exc) -> str:
    """The server's own message (the SDK's prefixes it with the status code)."""
    return _error_field(exc.body, "message") or exc.message

"""``unifiedreward``: UnifiedReward-2 (a Qwen-VL reward model) behind an OpenAI-compatible chat endpoint.

The model is asked Flow-GRPO's pointwise question (caption alignment and overall quality,
"assign a score from 1 to 5 after 'Final Score:'"). score = s / 5 with s the parsed
score, so the range is [0.2, 1] (Flow-GRPO's scaling). Parsing, in order:

1. ``Final Score: s`` (any case, markdown emphasis, ``s/5`` or ``s out of 5`` allowed);
2. else the mean of the per-aspect scores UnifiedReward-2 may give instead
   (``Alignment Score: a``, ``Coherence Score: c``, ``Style Score: t``, …);
3. else BadInput quoting the reply: an unparseable reply is never turned into a score.

A parsed s outside [1, 5] is also BadInput.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Images, Scorer, as_pil, check_batch
from recast_cli.rewards.chat import ChatClient, image_part, text_part

MAX_SCORE = 5.0
QUESTION = (
    "<image>\nYou are given a text caption and a generated image based on that caption. Your task is to "
    "evaluate this image based on two key criteria:\n1. Alignment with the Caption: Assess how well this image "
    "aligns with the provided caption. Consider the accuracy of depicted objects, their relationships, and "
    "attributes as described in the caption.\n2. Overall Image Quality: Examine the visual quality of this image, "
    "including clarity, detail preservation, color accuracy, and overall aesthetic appeal.\nBased on the above "
    "criteria, assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
_NUMBER = r"[*_\s]*\(?\s*(\d+(?:\.\d+)?)"
_FINAL = re.compile(r"final\s+score[*_\s]*(?:\(\s*1\s*-\s*5\s*\))?[*_\s]*[:：=]" + _NUMBER, re.IGNORECASE)
_ASPECT = re.compile(r"\b([a-z]+)\s+score[*_\s]*(?:\(\s*1\s*-\s*5\s*\))?[*_\s]*[:：=]" + _NUMBER, re.IGNORECASE)


def parse_score(reply: str) -> float | None:
    """The 1–5 score in a UnifiedReward reply (rules in the module docstring); None if there is none."""
    final = _FINAL.search(reply)
    if final:
        return float(final.group(1))
    aspects = [float(m.group(2)) for m in _ASPECT.finditer(reply) if m.group(1).lower() != "final"]
    return sum(aspects) / len(aspects) if aspects else None


class UnifiedRewardScore(Scorer):
    """s / 5, s the 1–5 score UnifiedReward-2 gives an (image, caption) pair."""

    name = "unifiedreward"
    fetch_also = (("CodeGoat24/UnifiedReward-2.0-qwen-7b", "model"),)  # what its vLLM server loads (docs/gpu.md)
    #: what serves it: ``recast serve-judges`` (``make judges``) starts ``vllm serve`` on these weights
    served_by = ("vllm", "CodeGoat24/UnifiedReward-2.0-qwen-7b")
    output_range = (1.0 / MAX_SCORE, 1.0)

    def __init__(self, url: str = "http://127.0.0.1:8000/v1", model: str = "UnifiedReward-2.0-qwen-7b",
                 api_key: str | None = None, timeout: float = 120.0, retries: int = 3, backoff: float = 1.0,
                 concurrency: int = 8, max_tokens: int = 512) -> None:
        self.client = ChatClient(url, model, self.name, api_key, timeout, retries, backoff, max_tokens, concurrency)
        self._replies: list[str] = []

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        check_batch(self.name, images, prompts)
        pairs = list(zip(as_pil(images), prompts))
        self._replies = self.client.map(
            lambda pair: self.client.ask([image_part(pair[0]), text_part(QUESTION.format(prompt=pair[1]))]), pairs)
        scores = []
        for i, reply in enumerate(self._replies):
            value = parse_score(reply)
            if value is None or not 1.0 <= value <= MAX_SCORE:
                excerpt = " ".join(reply.split())[:80]
                raise BadInput(f"unifiedreward: no 1-5 score in the reply for image {i}: {excerpt!r}")
            scores.append(value / MAX_SCORE)
        return np.asarray(scores, dtype=np.float64)

    def extras(self) -> dict[str, list[str]]:
        return {"unifiedreward_reply": list(self._replies)}

"""``geneval``: a client for a GenEval scoring server (the mmdet detector stack lives in that process).

Every image is scored against its GenEval metadata (``tag``, ``include``, ``exclude``,
``prompt``: one line of GenEval's ``evaluation_metadata.jsonl``). A prompt is either such a
JSON object itself or a prompt text looked up in the ``metadata`` jsonl file.
score = the server's per-image ``scores`` (as Flow-GRPO trains on), in [0, 1]; its
``rewards`` and ``strict_rewards`` come back as extras.

Protocols:

* ``json`` (default, safe): ``POST {url}`` with ``{"images": [base64 PNG], "meta_datas": [...],
  "only_strict": bool}`` → ``{"scores": [...], "rewards": [...], "strict_rewards": [...],
  "group_rewards": {...}, "group_strict_rewards": {...}}``.
* ``flowgrpo-pickle`` (explicit opt-in): Flow-GRPO's reward-server protocol, the same fields
  pickled, images as JPEG bytes. Unpickling a reply runs whatever code the server sends, so
  this protocol warns and must only point at a host you trust.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Images, Scorer, as_pil, check_batch, check_batch_size, chunks
from recast_cli.rewards.transport import Endpoint, png_base64, request

PROTOCOLS = ("json", "flowgrpo-pickle")
PICKLE_WARNING = ("geneval: the flowgrpo-pickle protocol unpickles the server's replies, which can run "
                  "arbitrary code: point it only at a GenEval server on a host you trust")
TOKEN_ENV = "RECAST_GENEVAL_TOKEN"


class GenEvalScore(Scorer):
    """The GenEval server's per-image score for (image, GenEval metadata)."""

    name = "geneval"
    output_range = (0.0, 1.0)

    def __init__(self, url: str = "http://127.0.0.1:18085", metadata: str | Path | None = None,
                 protocol: str = "json", only_strict: bool = False, token: str | None = None,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 1.0, batch_size: int = 64) -> None:
        if protocol not in PROTOCOLS:
            raise BadInput(f"geneval: protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if protocol == "flowgrpo-pickle":
            warnings.warn(PICKLE_WARNING, stacklevel=2)
        self.protocol, self.only_strict = protocol, bool(only_strict)
        self.endpoint = Endpoint(url, float(timeout), int(retries), float(backoff))
        self.batch_size = check_batch_size(self.name, batch_size)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.by_prompt = read_metadata(Path(metadata)) if metadata is not None else {}
        self._extras: dict[str, list] = {}

    def metadata_for(self, prompt: str) -> dict[str, Any]:
        """The GenEval metadata of ``prompt``: the prompt parsed as JSON, or its entry in the metadata file."""
        if prompt.lstrip().startswith("{"):
            try:
                meta = json.loads(prompt)
            except (json.JSONDecodeError, RecursionError):
                raise BadInput(f"geneval: prompt {prompt[:60]!r} starts like JSON but is not") from None
        elif prompt in self.by_prompt:
            meta = self.by_prompt[prompt]
        else:
            raise BadInput(f"geneval: no GenEval metadata for prompt {prompt[:60]!r} "
                           "(give the metadata JSON as the prompt or --opt geneval.metadata=FILE.jsonl)")
        if not isinstance(meta, dict) or "tag" not in meta or "include" not in meta:
            raise BadInput(f"geneval: metadata for {prompt[:60]!r} needs at least 'tag' and 'include'")
        return meta

    def check_prompts(self, prompts: Sequence[str]) -> None:
        for prompt in prompts:
            self.metadata_for(prompt)

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        count = check_batch(self.name, images, prompts)
        metas = [self.metadata_for(p) for p in prompts]
        pil = as_pil(images)
        out = np.empty(count, dtype=np.float64)
        extras: dict[str, list] = {"geneval_reward": [], "geneval_strict_reward": []}
        for part in chunks(count, self.batch_size):
            reply = self._post(pil[part], metas[part])
            n = part.stop - part.start
            out[part] = _numbers(reply, "scores", n, self.endpoint.url)
            extras["geneval_reward"].extend(_numbers(reply, "rewards", n, self.endpoint.url))
            extras["geneval_strict_reward"].extend(_numbers(reply, "strict_rewards", n, self.endpoint.url))
        self._extras = extras
        return out

    def extras(self) -> dict[str, list]:
        return {k: list(v) for k, v in self._extras.items()}

    def _post(self, images: list, metas: list[dict[str, Any]]) -> Any:
        if self.protocol == "json":
            body = json.dumps({"images": [png_base64(im) for im in images], "meta_datas": metas,
                               "only_strict": self.only_strict}).encode()
            headers = {**self._headers, "Content-Type": "application/json"}
        else:
            body = pickle.dumps({"images": [_jpeg(im) for im in images], "meta_datas": metas,
                                 "only_strict": self.only_strict})
            headers = {**self._headers, "Content-Type": "application/octet-stream"}
        reply = request(self.endpoint, "POST", "", self.name, body, headers)
        if reply.status in (401, 403):
            raise BadInput(f"geneval: {self.endpoint.url} refused the token (set ${TOKEN_ENV})")
        if reply.status != 200:
            raise BadInput(f"geneval: {self.endpoint.url} answered HTTP {reply.status}")
        if self.protocol == "json":
            return reply.json(self.name)
        try:
            return pickle.loads(reply.body)  # trusted-pickle: explicit flowgrpo-pickle opt-in, warned at construction
        except Exception:  # a reply that is not a pickle fails in many ways
            raise BadInput(f"geneval: {self.endpoint.url} sent a reply that is not a pickle") from None


def _jpeg(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")  # Flow-GRPO's encoding for this protocol
    return buffer.getvalue()


def _numbers(reply: Any, key: str, n: int, url: str) -> list[float]:
    values = reply.get(key) if isinstance(reply, dict) else None
    if (not isinstance(values, list) or len(values) != n
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
        raise BadInput(f"geneval: {url} sent a malformed reply (expected {n} finite numbers in {key!r})")
    return [float(v) for v in values]


def read_metadata(path: Path) -> dict[str, dict[str, Any]]:
    """GenEval metadata lines keyed by their ``prompt``."""
    if not path.is_file():
        raise BadInput(f"geneval: metadata file {path} does not exist")
    table: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        try:
            meta = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested too deeply
            raise BadInput(f"geneval: {path}:{number} is not a JSON line") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("prompt"), str):
            raise BadInput(f"geneval: {path}:{number} has no 'prompt' string")
        table[meta["prompt"]] = meta
    return table

"""Prompt lists in Flow-GRPO's dataset formats, and the trainer's deterministic prompt stream.

* ``toy``: the toy world's 24 prompts (``recast_cli.toy.renderer.all_prompts``);
* ``*.txt``: one prompt per line (Flow-GRPO's ``ocr``/``pickscore`` ``train.txt``);
* ``*.jsonl``: one JSON object per line with a ``prompt`` field (GenEval's
  ``train_metadata.jsonl`` / ``evaluation_metadata.jsonl``); other fields ride along.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.errors import BadInput


def load_prompts(source: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(prompts, metadata per prompt) from ``source``; BadInput names what is wrong."""
    if source == "toy":
        from recast_cli.toy.renderer import all_prompts

        prompts = all_prompts()
        return prompts, [{} for _ in prompts]
    path = Path(source)
    if not source or not path.is_file():
        raise BadInput(f"prompts file {source or '(none)'} does not exist (set [train] prompts or --set prompts=FILE)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read prompts file {path}: {exc}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise BadInput(f"prompts file {path} is empty")
    if path.suffix != ".jsonl":
        return lines, [{} for _ in lines]
    prompts, meta = [], []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise BadInput(f"{path}: line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise BadInput(f"{path}: line {number} has no string field 'prompt'")
        prompts.append(row["prompt"])
        meta.append({k: v for k, v in row.items() if k != "prompt"})
    return prompts, meta


def prompt_stream(count: int, seed: int, start: int, length: int) -> np.ndarray:
    """Prompt indices ``start … start+length−1`` of an endless stream of shuffled epochs.

    Epoch e is a permutation of ``range(count)`` drawn from (seed, e), so position p of the
    stream depends only on (count, seed, p): a resumed run continues exactly where it was.
    """
    out = np.empty(length, dtype=np.int64)
    for i, pos in enumerate(range(start, start + length)):
        epoch, offset = divmod(pos, count)
        out[i] = _epoch_order(count, seed, epoch)[offset]
    return out


_ORDERS: dict[tuple[int, int, int], np.ndarray] = {}


def _epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    key = (count, seed, epoch)
    if key not in _ORDERS:
        if len(_ORDERS) > 64:
            _ORDERS.clear()
        _ORDERS[key] = np.random.default_rng([seed, epoch, 0x7EC457]).permutation(count)
    return _ORDERS[key]

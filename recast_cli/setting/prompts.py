"""Prompt lists in Flow-GRPO's dataset formats, and the trainer's deterministic prompt stream.

* ``toy``: the toy world's 24 prompts (``recast_cli.toy.renderer.all_prompts``);
* ``*.txt``: one prompt per line (Flow-GRPO's ``ocr``/``pickscore`` ``train.txt``);
* ``*.jsonl``: one JSON object per line with a ``prompt`` field (GenEval's
  ``train_metadata.jsonl`` / ``evaluation_metadata.jsonl``); other fields ride along.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.errors import BadInput, shown
from recast_cli.seeds import epoch_rng


def read_prompt_file(path: str | os.PathLike[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """(prompts, metadata per prompt) of a ``.txt`` or ``.jsonl`` prompts file: the one reader.

    UTF-8, a leading byte-order mark ignored; blank lines are skipped. The one rule for
    duplicates: a prompt that appears twice is refused, naming both positions (it would weigh
    twice in training, collide in positives and be evaluated twice). BadInput names the file and
    what is wrong, quoting a prompt cut to ``errors.ECHO_LIMIT`` characters.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise BadInput(f"cannot read prompts file {p}: {reason}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise BadInput(f"prompts file {p} holds no prompt")
    if p.suffix != ".jsonl":
        prompts, meta = lines, [{} for _ in lines]
    else:
        prompts, meta = [], []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested too deeply
                raise BadInput(f"{p}: line {number} is not JSON") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise BadInput(f"{p}: line {number} has no string field 'prompt'")
            prompts.append(row["prompt"])
            meta.append({k: v for k, v in row.items() if k != "prompt"})
    seen: dict[str, int] = {}
    for i, prompt in enumerate(prompts):
        if prompt in seen:
            raise BadInput(f"prompts file {p}: prompt {shown(prompt)} appears twice (prompts {seen[prompt]} and {i})")
        seen[prompt] = i
    return prompts, meta


def load_prompts(source: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(prompts, metadata per prompt) of a ``[train]``/``[evaluate]`` ``prompts`` value: ``toy`` or a file."""
    if source == "toy":
        from recast_cli.toy.renderer import all_prompts

        prompts = all_prompts()
        return prompts, [{} for _ in prompts]
    path = Path(source)
    if not source or not path.is_file():
        raise BadInput(f"prompts file {source or '(none)'} does not exist (set [train] prompts or --set prompts=FILE)")
    return read_prompt_file(path)


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
        _ORDERS[key] = epoch_rng(seed, epoch).permutation(count)
    return _ORDERS[key]

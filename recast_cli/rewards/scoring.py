"""``recast score``, top to bottom: images + prompts + scorers → one row per (image, scorer) in Parquet.

Output ``recast.image-scores/1`` (:mod:`recast_cli.artifacts.image_scores`). Options that look
like secrets (token, key) are never recorded.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from recast_cli.artifacts.image_scores import ImageScores
from recast_cli.errors import BadInput, shown
from recast_cli.rewards.base import Scorer
from recast_cli.rewards.registry import build_scorer, scorer_class

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: The most pixels ``recast score`` decodes at once (one chunk; an image larger alone is its own chunk).
CHUNK_PIXELS = 2**25
_SECRET_WORDS = ("token", "key", "secret", "password")


def collect_images(items: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Image files in order: a folder contributes its image files sorted by name."""
    if not items:
        raise BadInput("no images given (--images DIR or FILES)")
    paths: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise BadInput(f"{item}: no image files ({', '.join(IMAGE_SUFFIXES)})")
            paths.extend(found)
        elif item.is_file():
            paths.append(item)
        else:
            raise BadInput(f"{item}: no such file or folder")
    return paths


def image_pixels(paths: Sequence[Path]) -> list[int]:
    """Pixels per image from the headers alone, before anything is decoded: each image within the
    per-image limit, their sum within ``images.max_total_pixels()`` (BadInput, one line, else)."""
    from recast_cli.images import MAX_TOTAL_PIXELS_ENV, image_size, max_total_pixels

    pixels = [width * height for width, height in map(image_size, paths)]
    limit = max_total_pixels()
    if sum(pixels) > limit:
        raise BadInput(f"the {len(paths)} images hold {sum(pixels)} pixels in all, more than the limit of {limit} "
                       f"(${MAX_TOTAL_PIXELS_ENV} sets it); score them in parts")
    return pixels


def pixel_chunks(pixels: Sequence[int], batch_size: int, budget: int | None = None) -> Iterator[slice]:
    """Consecutive slices of at most ``batch_size`` images and ``budget`` pixels (default
    ``CHUNK_PIXELS``; one image at least): the images decoded at once."""
    budget = CHUNK_PIXELS if budget is None else budget
    start, total = 0, 0
    for i, count in enumerate(pixels):
        if i > start and (i - start == batch_size or total + count > budget):
            yield slice(start, i)
            start, total = i, 0
        total += count
    if start < len(pixels):
        yield slice(start, len(pixels))


def load_image(path: Path) -> Image.Image:
    """The decoded RGB image; BadInput naming the file when it cannot be decoded or its header
    declares more pixels than the limit (``recast_cli.images``)."""
    from recast_cli.images import read_image

    return read_image(path).convert("RGB")


def read_prompts(prompt: str | None, prompts_file: Path | None, count: int) -> list[str]:
    """One prompt per image: ``prompt`` for all, or the lines of ``prompts_file`` in image order."""
    if (prompt is None) == (prompts_file is None):
        raise BadInput("give exactly one of --prompt TEXT and --prompts FILE")
    if prompt is not None:
        return [prompt] * count
    if not prompts_file.is_file():
        raise BadInput(f"{prompts_file}: no such prompts file")
    try:
        lines = prompts_file.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is no prompt
    except UnicodeDecodeError:
        raise BadInput(f"{prompts_file}: not UTF-8 text") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) != count:
        raise BadInput(f"{prompts_file}: {len(lines)} prompts for {count} images (one line per image, in order)")
    return lines


def parse_value(text: str) -> Any:
    """A JSON scalar when the text is one (3, 0.5, true), else the text itself (paths, names)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: brackets nested too deeply
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text


def scorer_options(rewards: Sequence[str], weights: Sequence[str], opts: Sequence[str], device: str | None,
                   batch_size: int | None) -> dict[str, dict[str, Any]]:
    """Keyword options per scorer from ``NAME=PATH`` (--reward-weights) and ``NAME.KEY=VALUE`` (--opt) items."""
    options: dict[str, dict[str, Any]] = {name: {} for name in rewards}
    by_base = {name.split("@", 1)[0]: name for name in rewards}

    def target(label: str, item: str) -> dict[str, Any]:
        if label not in by_base:
            raise BadInput(f"{item!r} names scorer {label!r}, which is not in --rewards")
        return options[by_base[label]]

    for item in weights:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"--reward-weights takes NAME=PATH, got {shown(item)}")
        target(name, item)["weights"] = path
    for item in opts:
        key, sep, value = item.partition("=")
        name, dot, option = key.rpartition(".")  # NAME may be a dotted module:Class reference
        if not sep or not dot or not name or not option:
            raise BadInput(f"--opt takes NAME.OPTION=VALUE, got {item!r}")
        target(name, item)[option] = parse_value(value)
    for name, chosen in options.items():
        accepted = set(_parameters(scorer_class(name)))
        if device is not None and "device" in accepted:
            chosen.setdefault("device", device)
        if batch_size is not None and "batch_size" in accepted:
            chosen.setdefault("batch_size", batch_size)
    return options


def _parameters(cls: type) -> Mapping[str, Any]:
    return inspect.signature(cls).parameters


def public_options(options: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The options fit to record: secrets dropped, values as JSON scalars or strings."""
    return {name: {k: v if isinstance(v, (int, float, bool)) else str(v) for k, v in chosen.items()
                   if not any(word in k.lower() for word in _SECRET_WORDS)}
            for name, chosen in options.items()}


def score_images(scorers: Mapping[str, Scorer], paths: Sequence[Path], pixels: Sequence[int],
                 prompts: Sequence[str], batch_size: int,
                 advance: Callable[[int], None] = lambda n: None) -> ImageScores:
    """Score every image with every scorer; ``advance(n)`` after each scorer's batch.

    ``pixels``: each image's pixel count (:func:`image_pixels`). The prompts are checked first.
    Images are decoded a chunk at a time (:func:`pixel_chunks`: ``batch_size`` images and
    ``CHUNK_PIXELS`` pixels at most), scored by every scorer and dropped: memory stays bounded
    however large the folder.
    """
    for scorer in scorers.values():
        scorer.check_prompts(prompts)
    scores = {label: np.empty(len(paths), dtype=np.float64) for label in scorers}
    columns: dict[str, dict[str, list]] = {label: {} for label in scorers}
    for part in pixel_chunks(pixels, batch_size):
        pictures = [load_image(p) for p in paths[part]]
        for label, scorer in scorers.items():
            scores[label][part] = scorer.score(pictures, list(prompts[part]))
            for column, cells in scorer.extras().items():
                columns[label].setdefault(column, [None] * part.start).extend(cells)
            for cells in columns[label].values():  # a column this batch did not fill stays null here
                cells.extend([None] * (part.stop - len(cells)))
            advance(part.stop - part.start)
    for label, values in scores.items():
        if not np.all(np.isfinite(values)):
            raise BadInput(f"{label}: produced a non-finite score")
    return ImageScores(tuple(map(str, paths)), tuple(prompts), scores,
                       {label: cells for label, cells in columns.items() if cells})


def build_scorers(options: Mapping[str, Mapping[str, Any]]) -> dict[str, Scorer]:
    """Every scorer, built before any scoring so a missing weight fails fast; labels drop ``@URL``."""
    built: dict[str, Scorer] = {}
    try:  # on any failure, release the scorers already built (models, connections)
        for name, chosen in options.items():
            label = name.split("@", 1)[0]
            if label in built:
                raise BadInput(f"scorer {label!r} is named twice in --rewards")
            built[label] = build_scorer(name, **chosen)
    except BaseException:
        for scorer in built.values():
            scorer.close()
        raise
    return built

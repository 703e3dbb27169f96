"""``recast.eval/1``: every evaluated image under every scorer (docs/method.md §7), one Parquet row per (image, scorer)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source
from recast_cli.artifacts.jsonio import json_dumps
from recast_cli.artifacts.tables import check_finite, open_parquet, require_columns, require_keys, write_parquet
from recast_cli.artifacts.weights import MODES
from recast_cli.errors import BadInput


EVAL_SCHEMA = "recast.eval/1"
EVAL_KINDS = ("reward", "judge")
EVAL_MODES = ("base", *MODES)

EVAL_COLUMNS: dict[str, pa.DataType] = {
    "image_id": pa.int64(),
    "prompt_id": pa.int64(),
    "prompt": pa.string(),
    "seed": pa.int64(),
    "image_path": pa.string(),
    "scorer": pa.string(),
    "kind": pa.string(),
    "score": pa.float64(),
}

#: What an evaluation table must say about what was evaluated, besides its provenance.
EVAL_RUN_KEYS = ("setting", "mode", "run", "train_seed", "lambda", "rewards", "weights_key", "sigmas", "checkpoint",
                 "sampling", "prompts_source")
#: The metadata key of each image's sha256 (hex), in image order: ``--add-judges`` scores only images that
#: still match it (a table written before recast recorded it has none, and is refused there)
IMAGE_SHA256 = "image_sha256"
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class EvalImage:
    """One evaluated image: ``image_path`` is relative to the folder of the evaluation table."""

    image_id: int
    prompt_id: int
    prompt: str
    seed: int
    image_path: str


@dataclass(frozen=True)
class EvalTable:
    """Scores of every evaluated image under every scorer (docs/method.md §7).

    ``scores[j, s]`` is scorer ``scorers[s]`` (of kind ``kinds[s]``: a training ``reward`` or a
    held-out ``judge``) on image ``images[j]``. ``meta`` holds the keys of ``EVAL_RUN_KEYS``:
    what was evaluated (the base model or a run's checkpoint) and how it was sampled.
    """

    images: tuple[EvalImage, ...]
    scorers: tuple[str, ...]
    kinds: tuple[str, ...]
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def column(self, scorer: str) -> np.ndarray:
        """The scores of one scorer, float64 [images]."""
        if scorer not in self.scorers:
            raise BadInput(f"evaluation has no scorer {scorer!r}; it has {', '.join(self.scorers)}")
        return self.scores[:, self.scorers.index(scorer)]

    def aggregate(self) -> np.ndarray:
        """``r = Σ_i λ_i·r_i`` per image over the training rewards, with the table's λ (docs/method.md §7)."""
        lam = np.asarray(self.meta["lambda"], dtype=np.float64)
        rewards = np.stack([self.column(r) for r in self.meta["rewards"]], axis=1) if len(lam) else \
            np.zeros((len(self.images), 0))
        return rewards @ lam

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        n, m = len(self.images), len(self.scorers)

        def per_image(name: str, dtype: pa.DataType) -> pa.Array:
            values = np.array([getattr(im, name) for im in self.images], dtype=object)
            return pa.array(np.repeat(values, m).tolist(), type=dtype)

        columns = {
            **{name: per_image(name, EVAL_COLUMNS[name]) for name in ("image_id", "prompt_id", "prompt", "seed",
                                                                       "image_path")},
            "scorer": pa.array(list(self.scorers) * n, type=pa.string()),
            "kind": pa.array(list(self.kinds) * n, type=pa.string()),
            "score": pa.array(np.asarray(self.scores, dtype=np.float64).reshape(n * m), type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(EVAL_COLUMNS.items())))
        return table.replace_schema_metadata({k: json_dumps(v) for k, v in metadata.items()})


def validate_eval(table: EvalTable, where: str = "evaluation table") -> None:
    """Raise BadInput unless ``table`` is a complete, consistent ``recast.eval/1`` table."""
    n, m = len(table.images), len(table.scorers)
    if n == 0 or m == 0:
        raise BadInput(f"{where}: no images or no scorers")
    if len(set(table.scorers)) != m or len(table.kinds) != m:
        raise BadInput(f"{where}: scorers must be distinct, one kind each (got {list(table.scorers)})")
    bad_kind = [k for k in table.kinds if k not in EVAL_KINDS]
    if bad_kind:
        raise BadInput(f"{where}: kind {bad_kind[0]!r} is not one of {', '.join(EVAL_KINDS)}")
    if np.shape(table.scores) != (n, m):
        raise BadInput(f"{where}: scores have shape {np.shape(table.scores)}, expected {(n, m)}")
    check_finite("score", np.asarray(table.scores, dtype=np.float64), where)
    ids = [im.image_id for im in table.images]
    if len(set(ids)) != n:
        raise BadInput(f"{where}: duplicate image_id")
    prompts: dict[int, str] = {}
    for im in table.images:
        if prompts.setdefault(im.prompt_id, im.prompt) != im.prompt:
            raise BadInput(f"{where}: prompt_id {im.prompt_id} names two different prompts")
        path = Path(im.image_path)
        if path.is_absolute() or ".." in path.parts:
            raise BadInput(f"{where}: image path {im.image_path!r} must be relative to the table's folder")
    require_keys(table.meta, EVAL_RUN_KEYS, where)
    meta = table.meta
    if meta["mode"] not in EVAL_MODES:
        raise BadInput(f"{where}: metadata 'mode' must be one of {', '.join(EVAL_MODES)}, got {meta['mode']!r}")
    rewards = [s for s, k in zip(table.scorers, table.kinds) if k == "reward"]
    if list(meta["rewards"]) != rewards:
        raise BadInput(f"{where}: metadata 'rewards' {meta['rewards']} differ from the reward rows {rewards}")
    if len(meta["lambda"]) != len(rewards):
        raise BadInput(f"{where}: metadata 'lambda' has {len(meta['lambda'])} values for {len(rewards)} rewards")
    if (meta["mode"] == "base") != (meta["checkpoint"] is None):
        raise BadInput(f"{where}: a base evaluation has no checkpoint and a run's evaluation has one")
    hashes = meta.get(IMAGE_SHA256)
    if hashes is not None and not (isinstance(hashes, list) and len(hashes) == n and all(
            isinstance(h, str) and SHA256.fullmatch(h) for h in hashes)):
        raise BadInput(f"{where}: metadata {IMAGE_SHA256!r} must hold one sha256 (64 hex digits) per image ({n})")


def write_eval(path: str | os.PathLike[str], table: EvalTable, *, config: Mapping[str, Any] | None = None,
               sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.eval/1`` Parquet file (image-major rows)."""
    validate_eval(table)
    provenance = Provenance.new(EVAL_SCHEMA, config, sources)
    write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_eval(path: str | os.PathLike[str], check_images: bool = False) -> EvalTable:
    """Read and validate a ``recast.eval/1`` file; with ``check_images`` every image file must exist."""
    arrow, meta, where = open_parquet(path, EVAL_SCHEMA)
    require_keys(meta, (*EVAL_RUN_KEYS, *PROVENANCE_KEYS[1:]), where)
    require_columns(arrow, EVAL_COLUMNS, where, not_null=tuple(EVAL_COLUMNS))
    for name, dtype in EVAL_COLUMNS.items():
        have = arrow.schema.field(name).type
        check = {pa.int64(): pa.types.is_integer, pa.string(): lambda t: pa.types.is_string(t) or
                 pa.types.is_large_string(t)}.get(dtype, pa.types.is_floating)
        if not check(have):
            raise BadInput(f"{where}: column {name!r} has type {have}, expected {dtype}")
    rows = arrow.select(list(EVAL_COLUMNS)).to_pylist()
    images: dict[int, EvalImage] = {}
    scorers: dict[str, str] = {}
    cells: dict[tuple[int, str], float] = {}
    for row in rows:
        image = EvalImage(**{k: row[k] for k in ("image_id", "prompt_id", "prompt", "seed", "image_path")})
        if images.setdefault(image.image_id, image) != image:
            raise BadInput(f"{where}: image_id {image.image_id} has rows that disagree on its prompt, seed or path")
        if scorers.setdefault(row["scorer"], row["kind"]) != row["kind"]:
            raise BadInput(f"{where}: scorer {row['scorer']!r} has rows of two kinds")
        key = (image.image_id, row["scorer"])
        if key in cells:
            raise BadInput(f"{where}: duplicate row for (image_id {key[0]}, scorer {key[1]!r})")
        cells[key] = row["score"]
    ordered = sorted(images.values(), key=lambda im: im.image_id)
    names = tuple(scorers)
    if len(cells) != len(ordered) * len(names):
        raise BadInput(f"{where}: incomplete: not every image has a row for every scorer")
    scores = np.array([[cells[(im.image_id, s)] for s in names] for im in ordered], dtype=np.float64)
    table = EvalTable(images=tuple(ordered), scorers=names, kinds=tuple(scorers[s] for s in names), scores=scores,
                      meta={k: v for k, v in meta.items() if k not in PROVENANCE_KEYS},
                      provenance=Provenance.from_metadata(meta, where))
    validate_eval(table, where)
    if check_images:
        root = Path(path).parent
        missing = [im.image_path for im in ordered if not (root / im.image_path).is_file()]
        if missing:
            raise BadInput(f"{where}: image {missing[0]} is missing ({len(missing)} of {len(ordered)})")
    return table

"""``recast.positives/1``: a folder of π⁺ images (E2) and the ``manifest.parquet`` that lists them."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source, sha256_file
from recast_cli.artifacts.jsonio import json_dumps
from recast_cli.artifacts.tables import open_parquet, require_columns, require_keys, write_parquet
from recast_cli.errors import BadInput


POSITIVES_SCHEMA = "recast.positives/1"
MANIFEST_NAME = "manifest.parquet"
JOURNAL_NAME = ".recast-partial.jsonl"  # beside the images while the folder is being written

POSITIVE_COLUMNS: dict[str, pa.DataType] = {
    "prompt_id": pa.int32(),
    "prompt": pa.string(),
    "sample_id": pa.int32(),
    "image_path": pa.string(),
    "source": pa.string(),
    "seed": pa.int64(),
    "sha256": pa.string(),
}
#: Optional, nullable: null = the image is a positive for every reward (a surrogate generator);
#: a name = a positive of that reward's π⁺ only (``self`` sampling-importance-resampling).
POSITIVE_REWARD_COLUMN = ("reward", pa.string())
#: Optional, nullable: the std of the row's reward over the π^old draws its prompt's positives
#: were resampled from (``self`` with standardisation): the scale r̃ = r / s of its tilt (E2).
POSITIVE_SCALE_COLUMN = ("reward_std", pa.float64())


@dataclass(frozen=True)
class PositiveSample:
    """One π⁺ image: ``image_path`` is relative to the positives folder; ``seed`` may be -1 (none).

    ``reward`` is None when the image serves every reward, else the one reward whose π⁺_i (E2)
    it was resampled for; rows of different rewards may share one image file. ``reward_std``
    is the π^old scale of that reward's tilt when the source recorded one (``self``).
    """

    prompt_id: int
    prompt: str
    sample_id: int
    image_path: str
    source: str
    seed: int
    sha256: str
    reward: str | None = None
    reward_std: float | None = None


@dataclass(frozen=True)
class Positives:
    """A ``recast.positives/1`` folder: the manifest rows, run metadata and provenance."""

    root: Path
    samples: tuple[PositiveSample, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def prompts(self) -> list[str]:
        """The prompts in prompt_id order."""
        return [p for _, p in sorted({(s.prompt_id, s.prompt) for s in self.samples})]

    def rewards(self) -> tuple[str, ...]:
        """The rewards with their own positives, in manifest order; () when every image serves every reward."""
        return tuple(dict.fromkeys(s.reward for s in self.samples if s.reward is not None))

    def for_prompt(self, prompt_id: int, reward: str | None = None) -> list[PositiveSample]:
        """The positives of one prompt, for ``reward`` when the folder holds one set per reward."""
        per_reward = self.rewards()
        if per_reward and reward is None:
            raise BadInput(f"{self.root}: positives are per reward ({', '.join(per_reward)}); name the reward")
        if per_reward and reward not in per_reward:
            raise BadInput(f"{self.root}: positives are per reward ({', '.join(per_reward)}); "
                           f"none for reward {reward!r}")
        return sorted((s for s in self.samples if s.prompt_id == prompt_id and s.reward in (None, reward)),
                      key=lambda s: s.sample_id)


def _positive_key(s: PositiveSample) -> tuple[str, int, int]:
    return (s.reward or "", s.prompt_id, s.sample_id)


def write_positives_manifest(root: str | os.PathLike[str], samples: Sequence[PositiveSample], *,
                             meta: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                             sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Write ``root/manifest.parquet`` atomically; the images must already be in place.

    ``meta`` holds run facts (e.g. refusals per prompt, the generator and its settings), JSON.
    """
    root = Path(root)
    keys = [_positive_key(s) for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInput(f"{root}: duplicate (reward, prompt_id, sample_id) in the manifest")
    if len({s.reward is None for s in samples}) > 1:
        raise BadInput(f"{root}: either every row names its reward or none does")
    provenance = Provenance.new(POSITIVES_SCHEMA, config, sources)
    fields = [*POSITIVE_COLUMNS.items(), POSITIVE_REWARD_COLUMN]
    if any(s.reward_std is not None for s in samples):
        fields.append(POSITIVE_SCALE_COLUMN)
    columns = {name: pa.array([getattr(s, name) for s in samples], type=dtype) for name, dtype in fields}
    table = pa.table(columns, schema=pa.schema(fields))
    metadata = {**dict(meta or {}), **provenance.to_metadata()}
    table = table.replace_schema_metadata({k: json_dumps(v) for k, v in metadata.items()})
    write_parquet(root / MANIFEST_NAME, table)
    return provenance


def read_positives(root: str | os.PathLike[str], verify: bool = True) -> Positives:
    """Read a ``recast.positives/1`` folder; with ``verify`` every image must exist and match its sha256."""
    root = Path(root)
    manifest = root / MANIFEST_NAME
    if not manifest.is_file():
        raise BadInput(f"{root}: not a positives folder (no {MANIFEST_NAME})")
    arrow, meta, where = open_parquet(manifest, POSITIVES_SCHEMA)
    require_keys(meta, PROVENANCE_KEYS[1:], where)
    require_columns(arrow, POSITIVE_COLUMNS, where, not_null=tuple(POSITIVE_COLUMNS))
    reward_name = POSITIVE_REWARD_COLUMN[0]
    rows = arrow.select(list(POSITIVE_COLUMNS)).to_pylist()
    if reward_name in arrow.column_names:
        column = arrow.column(reward_name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_null(column.type)):
            raise BadInput(f"{where}: column {reward_name!r} has type {column.type}, expected string")
        if 0 < column.null_count < len(column):
            raise BadInput(f"{where}: column {reward_name!r} must name a reward on every row or on none")
        for row, reward in zip(rows, column.to_pylist()):
            row[reward_name] = reward
    scale_name = POSITIVE_SCALE_COLUMN[0]
    if scale_name in arrow.column_names:
        column = arrow.column(scale_name)
        if not (pa.types.is_floating(column.type) or pa.types.is_null(column.type)):
            raise BadInput(f"{where}: column {scale_name!r} has type {column.type}, expected float64")
        for row, scale in zip(rows, column.to_pylist()):
            if scale is not None and not (math.isfinite(scale) and scale >= 0):
                raise BadInput(f"{where}: column {scale_name!r} holds {scale!r}; a std is finite and >= 0")
            row[scale_name] = scale
    samples = tuple(PositiveSample(**row) for row in rows)
    keys = [_positive_key(s) for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInput(f"{where}: duplicate (reward, prompt_id, sample_id) rows")
    prompts: dict[int, str] = {}
    digests: dict[Path, str] = {}
    for s in samples:
        if prompts.setdefault(s.prompt_id, s.prompt) != s.prompt:
            raise BadInput(f"{where}: prompt_id {s.prompt_id} names two different prompts")
        path = (root / s.image_path).resolve()
        if root.resolve() not in path.parents:
            raise BadInput(f"{where}: image path {s.image_path!r} leaves the positives folder")
        if verify:
            if path not in digests:  # rows of several rewards may share one image: hash it once
                if not path.is_file():
                    raise BadInput(f"{where}: image {s.image_path} is missing")
                digests[path] = sha256_file(path)
            if digests[path] != s.sha256:
                raise BadInput(f"{where}: image {s.image_path} does not match its sha256")
    return Positives(root=root, samples=samples,
                     meta={k: v for k, v in meta.items() if k not in PROVENANCE_KEYS},
                     provenance=Provenance.from_metadata(meta, where))

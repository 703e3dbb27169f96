"""``recast.image-scores/1`` (``recast score``): one row per (image, scorer).

Columns ``image`` (path as given), ``prompt``, ``scorer``, ``score`` (float64), then any
scorer-specific extras (null for the other scorers' rows); Parquet key-value metadata holds the
provenance (JSON values) with every image and the prompts file as sources.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts.io import Provenance, Source, atomic_write_bytes
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.errors import BadInput

IMAGE_SCORES_SCHEMA = "recast.image-scores/1"


@dataclass(frozen=True)
class ImageScores:
    """Scores of every image under every scorer: ``scores[name]`` is float64 [n_images]."""

    images: tuple[str, ...]
    prompts: tuple[str, ...]
    scores: dict[str, np.ndarray]
    extras: dict[str, dict[str, list]] = field(default_factory=dict)

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        names = list(self.scores)
        n, m = len(self.images), len(names)
        columns: dict[str, pa.Array] = {
            "image": pa.array(np.repeat(np.array(self.images, dtype=object), m), type=pa.string()),
            "prompt": pa.array(np.repeat(np.array(self.prompts, dtype=object), m), type=pa.string()),
            "scorer": pa.array(names * n, type=pa.string()),
            "score": pa.array(np.stack([self.scores[s] for s in names], axis=1).ravel(), type=pa.float64()),
        }
        for scorer, extra in self.extras.items():
            j = names.index(scorer)
            for column, values in extra.items():
                if column in columns:
                    raise BadInput(f"{scorer}: extra column {column!r} clashes with another column")
                cells: list[Any] = [None] * (n * m)
                cells[j::m] = values
                columns[column] = pa.array(cells)
        meta = provenance.to_metadata()
        return pa.table(columns).replace_schema_metadata({k: json.dumps(v, sort_keys=True) for k, v in meta.items()})


def write_image_scores(path: str | os.PathLike[str], table: ImageScores, config: Mapping[str, Any],
                      sources: Sequence[Source | str | os.PathLike[str]]) -> Provenance:
    """Write ``table`` atomically as ``recast.image-scores/1`` Parquet."""
    provenance = Provenance.new(IMAGE_SCORES_SCHEMA, config, sources)
    buffer = io.BytesIO()
    pq.write_table(table.to_arrow(provenance), buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return provenance


def read_image_scores(path: str | os.PathLike[str]) -> pa.Table:
    """The Arrow table of a ``recast.image-scores/1`` file; BadInput if it is not one."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such file")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError):
        raise BadInput(f"{p}: not a readable Parquet file") from None
    try:
        schema = json_loads((table.schema.metadata or {}).get(b"schema", b"null"), f"{p}: metadata 'schema'")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{p}: metadata 'schema' is not JSON") from None
    if schema != IMAGE_SCORES_SCHEMA:
        raise BadInput(f"{p}: schema tag is {schema!r}, expected {IMAGE_SCORES_SCHEMA!r}")
    return table

"""``recast.judgements/1`` (``recast judge``): one row per (pair, presentation order).

Columns ``pair``, ``order`` ("ab" or "ba"), optionally ``prompt``, ``image_a``, ``image_b``, one
column per criterion with the winner after undoing the order ("a", "b" or "tie"), and the raw
``reply``; the per-criterion summary (win rates, order agreement, first-position share) is the
``summary`` metadata key, beside the provenance keys.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts.io import Provenance, Source, atomic_write_bytes
from recast_cli.artifacts.tables import decode_metadata, read_parquet, require_schema

JUDGEMENTS_SCHEMA = "recast.judgements/1"


@dataclass(frozen=True)
class Pair:
    prompt: str
    image_a: Path
    image_b: Path


@dataclass(frozen=True)
class Verdict:
    """One presentation of one pair: ``winners[c]`` is "a", "b" or "tie" after undoing the order."""

    pair: int
    order: str
    winners: dict[str, str]
    reply: str


def write_judgements(path: str | os.PathLike[str], verdicts: Sequence[Verdict], summary: Mapping[str, Any],
                     config: Mapping[str, Any], sources: Sequence[Source | str | os.PathLike[str]],
                     pairs: Sequence[Pair] | None = None) -> Provenance:
    """Write the verdicts atomically as ``recast.judgements/1`` Parquet (summary in the metadata)."""
    provenance = Provenance.new(JUDGEMENTS_SCHEMA, config, sources)
    criteria = list(summary)
    columns: dict[str, Any] = {
        "pair": pa.array([v.pair for v in verdicts], type=pa.int32()),
        "order": pa.array([v.order for v in verdicts], type=pa.string()),
    }
    if pairs is not None:
        columns["prompt"] = pa.array([pairs[v.pair].prompt for v in verdicts], type=pa.string())
        columns["image_a"] = pa.array([str(pairs[v.pair].image_a) for v in verdicts], type=pa.string())
        columns["image_b"] = pa.array([str(pairs[v.pair].image_b) for v in verdicts], type=pa.string())
    for criterion in criteria:
        columns[criterion] = pa.array([v.winners[criterion] for v in verdicts], type=pa.string())
    columns["reply"] = pa.array([v.reply for v in verdicts], type=pa.string())
    meta = {"summary": dict(summary), **provenance.to_metadata()}
    table = pa.table(columns).replace_schema_metadata({k: json.dumps(v, sort_keys=True) for k, v in meta.items()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return provenance


def read_judgements(path: str | os.PathLike[str]) -> pa.Table:
    """The table (its metadata: ``decode_metadata``); BadInput unless it is a ``recast.judgements/1`` file."""
    p = Path(path)
    arrow = read_parquet(p)
    require_schema(decode_metadata(arrow.schema.metadata, str(p)), JUDGEMENTS_SCHEMA, str(p))
    return arrow

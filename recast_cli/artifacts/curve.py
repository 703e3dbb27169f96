"""``recast.curve/1``: mean rewards of a 1-D policy at training steps, one Parquet row per (step, sampler, scorer)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recast_cli.artifacts.evaluation import EVAL_MODES
from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source
from recast_cli.artifacts.jsonio import json_dumps
from recast_cli.artifacts.tables import check_finite, open_parquet, require_columns, require_keys, write_parquet
from recast_cli.errors import BadInput


CURVE_SCHEMA = "recast.curve/1"
CURVE_SAMPLERS = ("sde", "ode")

CURVE_COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int64(),
    "sampler": pa.string(),
    "scorer": pa.string(),
    "n": pa.int64(),
    "mean": pa.float64(),
    "std": pa.float64(),
}

#: What a curve table must say about what was evaluated, besides its provenance.
CURVE_RUN_KEYS = ("setting", "mode", "run", "train_seed", "lambda", "rewards", "weights_key", "checkpoints",
                  "sampling")


@dataclass(frozen=True)
class CurveTable:
    """Mean rewards of a policy at several training steps: ``recast evaluate`` in the 1-D world.

    Where samples are scalars (flow1d) an evaluation keeps the per-scorer mean and std over its
    n samples rather than one row per sample. ``points`` lists the (step, sampler) pairs
    evaluated, in order; ``mean``/``std`` are [points, scorers]; the scorers are the rewards in
    ``meta['rewards']`` order followed by ``aggregate`` (Σ_i λ_i·r_i per sample). Step 0 is the
    base policy (mode ``base``).
    """

    points: tuple[tuple[int, str], ...]
    scorers: tuple[str, ...]
    n: int
    mean: np.ndarray
    std: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def value(self, step: int, sampler: str, scorer: str = "aggregate") -> float:
        return float(self.mean[self.points.index((step, sampler)), self.scorers.index(scorer)])

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        m = len(self.scorers)
        columns = {
            "step": pa.array([s for s, _ in self.points for _ in range(m)], type=pa.int64()),
            "sampler": pa.array([k for _, k in self.points for _ in range(m)], type=pa.string()),
            "scorer": pa.array(list(self.scorers) * len(self.points), type=pa.string()),
            "n": pa.array([self.n] * (m * len(self.points)), type=pa.int64()),
            "mean": pa.array(np.asarray(self.mean, dtype=np.float64).reshape(-1), type=pa.float64()),
            "std": pa.array(np.asarray(self.std, dtype=np.float64).reshape(-1), type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(CURVE_COLUMNS.items())))
        return table.replace_schema_metadata({k: json_dumps(v) for k, v in metadata.items()})


def validate_curve(table: CurveTable, where: str = "curve table") -> None:
    """Raise BadInput unless ``table`` is a complete, consistent ``recast.curve/1`` table."""
    k, m = len(table.points), len(table.scorers)
    if k == 0 or m == 0:
        raise BadInput(f"{where}: no evaluated points or no scorers")
    if len(set(table.points)) != k:
        raise BadInput(f"{where}: a (step, sampler) pair is evaluated twice")
    for step, sampler in table.points:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or sampler not in CURVE_SAMPLERS:
            raise BadInput(f"{where}: point ({step!r}, {sampler!r}) needs a step >= 0 and a sampler of "
                           f"{', '.join(CURVE_SAMPLERS)}")
    if len(set(table.scorers)) != m or table.scorers[-1] != "aggregate":
        raise BadInput(f"{where}: scorers must be distinct and end with 'aggregate', got {list(table.scorers)}")
    if isinstance(table.n, bool) or not isinstance(table.n, int) or table.n < 1:
        raise BadInput(f"{where}: n must be a positive integer, got {table.n!r}")
    for name in ("mean", "std"):
        values = np.asarray(getattr(table, name), dtype=np.float64)
        if values.shape != (k, m):
            raise BadInput(f"{where}: {name} has shape {values.shape}, expected {(k, m)}")
        check_finite(name, values, where)
    require_keys(table.meta, CURVE_RUN_KEYS, where)
    meta = table.meta
    if meta["mode"] not in EVAL_MODES:
        raise BadInput(f"{where}: metadata 'mode' must be one of {', '.join(EVAL_MODES)}, got {meta['mode']!r}")
    if list(meta["rewards"]) != list(table.scorers[:-1]):
        raise BadInput(f"{where}: metadata 'rewards' {meta['rewards']} differ from the scorers {list(table.scorers[:-1])}")
    if len(meta["lambda"]) != m - 1:
        raise BadInput(f"{where}: metadata 'lambda' has {len(meta['lambda'])} values for {m - 1} rewards")
    if (meta["mode"] == "base") != all(step == 0 for step, _ in table.points):
        raise BadInput(f"{where}: a base evaluation holds step 0 only, a run's evaluation its checkpoints")


def write_curve(path: str | os.PathLike[str], table: CurveTable, *, config: Mapping[str, Any] | None = None,
                sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.curve/1`` Parquet file."""
    validate_curve(table)
    provenance = Provenance.new(CURVE_SCHEMA, config, sources)
    write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_curve(path: str | os.PathLike[str]) -> CurveTable:
    """Read and validate a ``recast.curve/1`` file."""
    arrow, meta, where = open_parquet(path, CURVE_SCHEMA)
    require_keys(meta, (*CURVE_RUN_KEYS, *PROVENANCE_KEYS[1:]), where)
    require_columns(arrow, CURVE_COLUMNS, where, not_null=tuple(CURVE_COLUMNS))
    rows = arrow.select(list(CURVE_COLUMNS)).to_pylist()
    points = tuple(dict.fromkeys((int(r["step"]), r["sampler"]) for r in rows))
    scorers = tuple(dict.fromkeys(r["scorer"] for r in rows))
    ns = {int(r["n"]) for r in rows}
    if len(ns) != 1:
        raise BadInput(f"{where}: rows disagree on n ({sorted(ns)})")
    cells = {}
    for r in rows:
        key = ((int(r["step"]), r["sampler"]), r["scorer"])
        if key in cells:
            raise BadInput(f"{where}: duplicate row for step {key[0][0]}, sampler {key[0][1]!r}, scorer {key[1]!r}")
        cells[key] = (r["mean"], r["std"])
    if len(cells) != len(points) * len(scorers):
        raise BadInput(f"{where}: incomplete: not every (step, sampler) has a row for every scorer")
    mean = np.array([[cells[(p, s)][0] for s in scorers] for p in points], dtype=np.float64)
    std = np.array([[cells[(p, s)][1] for s in scorers] for p in points], dtype=np.float64)
    table = CurveTable(points=points, scorers=scorers, n=ns.pop(), mean=mean, std=std,
                       meta={k: v for k, v in meta.items() if k not in PROVENANCE_KEYS},
                       provenance=Provenance.from_metadata(meta, where))
    validate_curve(table, where)
    return table

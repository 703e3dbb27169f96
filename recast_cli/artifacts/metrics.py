"""``RUN/metrics.parquet`` (``recast.metrics/1``): one row per (training step, reward).

Reward columns: ``reward_mean``, ``reward_std`` (over the step's images) and ``adv_abs``
(list over t = 1…T: the mean |T'·W_{i,t}·A_i|, T' the number of trained steps, the reward's
share of the per-step advantage).
Step columns, repeated on every reward's row: ``aggregate`` (Σ_i λ_i·mean r_i with the run's
λ), ``loss``, ``policy_loss``, ``kl``, ``clip_frac``, ``grad_norm``, ``lr``, ``images``,
``step_adv_abs`` (list over t: the mean |A_t| after clipping; 0 at steps not trained) and the
wall times ``sample_s`` / ``update_s`` (the only columns a resumed run does not reproduce).
Added later, so null (or absent) in the files of older runs: ``reward_group_std`` (the reward's
within-group std pooled over the step's groups, the stall detector's scale) and ``stall`` (whether
the stall detector flags the reward at the step, ``train/stall``; null where it did not watch) and
``adv_corr`` (list over the run's rewards: the correlation of this reward's group advantages with each
one's over the step's samples, null where a reward's advantages were all zero; ``train/conflict``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from recast_cli.artifacts.io import Provenance
from recast_cli.artifacts.tables import open_parquet, write_parquet

METRICS_SCHEMA = "recast.metrics/1"
TIMING_COLUMNS = ("sample_s", "update_s")
STEP_COLUMNS = ("aggregate", "loss", "policy_loss", "kl", "clip_frac", "grad_norm", "lr", "images",
                *TIMING_COLUMNS)


def metrics_schema() -> pa.Schema:
    """The Arrow schema of the table's columns."""
    fields = [pa.field("step", pa.int64()), pa.field("reward", pa.string()),
              pa.field("reward_mean", pa.float64()), pa.field("reward_std", pa.float64()),
              pa.field("adv_abs", pa.list_(pa.float64()))]
    fields += [pa.field(name, pa.int64() if name == "images" else pa.float64()) for name in STEP_COLUMNS]
    fields.append(pa.field("step_adv_abs", pa.list_(pa.float64())))
    fields += [pa.field("reward_group_std", pa.float64()), pa.field("stall", pa.bool_()),
               pa.field("adv_corr", pa.list_(pa.float64()))]
    return pa.schema(fields)


def write_metrics(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> None:
    """All rows so far, written atomically with the run's config as provenance."""
    table = pa.Table.from_pylist(list(rows), schema=metrics_schema())
    provenance = Provenance.new(METRICS_SCHEMA, dict(config), [])
    meta = {k.encode(): json.dumps(v, sort_keys=True).encode() for k, v in provenance.to_metadata().items()}
    write_parquet(path, table.replace_schema_metadata(meta))


def read_metrics(path: str | os.PathLike[str]) -> pa.Table:
    """The table (BadInput for a file of another schema)."""
    table, _, _ = open_parquet(path, METRICS_SCHEMA)
    return table

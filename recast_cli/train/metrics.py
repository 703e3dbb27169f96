"""``RUN/metrics.parquet`` (``recast.metrics/1``): one row per (training step, reward).

Reward columns: ``reward_mean``, ``reward_std`` (over the step's images) and ``adv_abs``
(list over t = 1…T: the mean |T·W_{i,t}·A_i|, the reward's share of the per-step advantage).
Step columns, repeated on every reward's row: ``aggregate`` (Σ_i λ_i·mean r_i with the run's
λ), ``loss``, ``policy_loss``, ``kl``, ``clip_frac``, ``grad_norm``, ``lr``, ``images``,
``step_adv_abs`` (list over t: the mean |A_t| after clipping; 0 at steps not trained) and the
wall times ``sample_s`` / ``update_s`` (the only columns a resumed run does not reproduce).
The same scalars go to TensorBoard under ``RUN/tensorboard``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from recast_cli.artifacts import Provenance, open_parquet, write_parquet

METRICS_SCHEMA = "recast.metrics/1"
TIMING_COLUMNS = ("sample_s", "update_s")
STEP_COLUMNS = ("aggregate", "loss", "policy_loss", "kl", "clip_frac", "grad_norm", "lr", "images",
                *TIMING_COLUMNS)


class MetricsLog:
    """Rows in memory, the Parquet file rewritten atomically after every step (rank 0 only)."""

    def __init__(self, run: Path, config: dict[str, Any], tensorboard: bool = True):
        self.path = run / "metrics.parquet"
        self.config = config
        self.rows: list[dict[str, Any]] = []
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency; a trimmed install still trains
                SummaryWriter = None
            if SummaryWriter is not None:
                self.writer = SummaryWriter(log_dir=str(run / "tensorboard"))

    def resume(self, upto_step: int) -> None:
        """Keep the rows of steps ≤ ``upto_step`` (the checkpoint a resumed run starts from)."""
        if self.path.is_file():
            table, _, _ = open_parquet(self.path, METRICS_SCHEMA)
            self.rows = [r for r in table.to_pylist() if r["step"] <= upto_step]

    def add(self, step: int, per_reward: dict[str, dict[str, Any]], scalars: dict[str, Any],
            step_adv_abs: list[float]) -> None:
        for reward, values in per_reward.items():
            self.rows.append({"step": step, "reward": reward, **values, **scalars, "step_adv_abs": step_adv_abs})
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(f"train/{name}", value, step)
            for reward, values in per_reward.items():
                self.writer.add_scalar(f"reward/{reward}", values["reward_mean"], step)
            self.writer.flush()

    def write(self) -> None:
        table = pa.Table.from_pylist(self.rows, schema=_schema())
        provenance = Provenance.new(METRICS_SCHEMA, self.config, [])
        meta = {k.encode(): json.dumps(v, sort_keys=True).encode() for k, v in provenance.to_metadata().items()}
        write_parquet(self.path, table.replace_schema_metadata(meta))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _schema() -> pa.Schema:
    fields = [pa.field("step", pa.int64()), pa.field("reward", pa.string()),
              pa.field("reward_mean", pa.float64()), pa.field("reward_std", pa.float64()),
              pa.field("adv_abs", pa.list_(pa.float64()))]
    fields += [pa.field(name, pa.int64() if name == "images" else pa.float64()) for name in STEP_COLUMNS]
    fields.append(pa.field("step_adv_abs", pa.list_(pa.float64())))
    return pa.schema(fields)


def read_metrics(path: str | Path) -> pa.Table:
    table, _, _ = open_parquet(path, METRICS_SCHEMA)
    return table

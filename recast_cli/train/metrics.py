"""The trainer's metrics log: the rows of ``RUN/metrics.parquet`` (``recast.metrics/1``; its columns
are documented with its schema in :mod:`recast_cli.artifacts.metrics`), rewritten after every
step, and the same scalars in TensorBoard under ``RUN/tensorboard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recast_cli.artifacts.metrics import METRICS_SCHEMA, STEP_COLUMNS, TIMING_COLUMNS, read_metrics, write_metrics

__all__ = ["METRICS_SCHEMA", "STEP_COLUMNS", "TIMING_COLUMNS", "MetricsLog", "read_metrics", "step_metrics"]


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
            self.rows = [r for r in read_metrics(self.path).to_pylist() if r["step"] <= upto_step]

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
        write_metrics(self.path, self.rows, self.config)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def step_metrics(cfg, W, lam, trained: int, all_rewards, adv, stats: dict[str, float], lr: float, *,
                 sample_s: float, update_s: float) -> dict[str, Any]:
    """One step's metrics rows from its gathered rewards [P·G, m] and advantages A_i [P·G, m].

    ``adv_abs`` of reward i at step t is the mean |T'·W_{i,t}·A_i| (its share of E13's A_t);
    ``step_adv_abs`` the mean |A_t| after clipping; ``aggregate`` Σ_i λ_i·mean r_i.
    """
    import numpy as np

    from recast_cli.train.objective import step_advantages

    means = all_rewards.mean(dim=0).numpy()
    stds = all_rewards.std(dim=0, unbiased=False).numpy()
    Tw = W * trained
    per_reward = {name: {"reward_mean": float(means[i]), "reward_std": float(stds[i]),
                         "adv_abs": (adv[:, i].abs()[:, None] * Tw[i][None, :]).mean(dim=0).tolist()}
                  for i, name in enumerate(cfg.rewards)}
    full_t = step_advantages(adv, W, clip=cfg.adv_clip, trained=trained)
    scalars = {"aggregate": float(np.dot(lam, means)), **stats, "lr": lr,
               "images": int(len(all_rewards)), "sample_s": sample_s, "update_s": update_s}
    return {"per_reward": per_reward, "scalars": scalars, "step_adv_abs": full_t.abs().mean(dim=0).tolist()}

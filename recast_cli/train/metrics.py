"""The trainer's metrics log: the rows of ``RUN/metrics.parquet`` (``recast.metrics/1``; its columns
are documented with its schema in :mod:`recast_cli.artifacts.metrics`), rewritten after every
step, and the same numbers, W and sample pictures sent to the run's loggers (``train/loggers``:
TensorBoard under ``RUN/tensorboard``, W&B). The stall detector (``train/stall``) watches the rows
as they are added: its flags go into the rows (``stall``) and to the loggers (``stall/NAME``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts.metrics import METRICS_SCHEMA, STEP_COLUMNS, TIMING_COLUMNS, read_metrics, write_metrics
from recast_cli.train.loggers import RunLoggers
from recast_cli.train.panels import grid_picks, is_image_batch, sample_grid, weights_heatmap
from recast_cli.train.conflict import ConflictWatch, advantage_correlation
from recast_cli.train.stall import StallStep, StallWatch, group_spread, onset_message

__all__ = ["METRICS_SCHEMA", "STEP_COLUMNS", "TIMING_COLUMNS", "MetricsLog", "logged_scalars", "read_metrics",
           "step_metrics"]


class MetricsLog:
    """Rows in memory, the Parquet file rewritten atomically after every step (rank 0 only), the run's
    loggers (none by default) and the stall detector's watch (none: ``stall`` is null in the rows)."""

    def __init__(self, run: Path, config: dict[str, Any], loggers: RunLoggers | None = None,
                 stall: StallWatch | None = None, conflict: ConflictWatch | None = None):
        self.path = run / "metrics.parquet"
        self.config = config
        self.rows: list[dict[str, Any]] = []
        self.loggers = loggers if loggers is not None else RunLoggers()
        self.stall = stall
        self.conflict = conflict

    def resume(self, upto_step: int) -> None:
        """Keep the rows of steps ≤ ``upto_step`` (the checkpoint a resumed run starts from); the stall watch
        is fed them again, in step order, so it goes on as if the run had not stopped."""
        if self.path.is_file():
            self.rows = [r for r in read_metrics(self.path).to_pylist() if r["step"] <= upto_step]
        if self.stall is not None:
            by_step: dict[int, dict[str, dict[str, Any]]] = {}
            for row in self.rows:
                by_step.setdefault(row["step"], {})[row["reward"]] = row
            for step in sorted(by_step):
                self._watch(by_step[step])
        if self.conflict is not None:  # replayed so that a pair that warned before the restart stays quiet
            self.conflict.start()
            for row in self.rows:
                if row["reward"] == self.conflict.rewards[0] and row.get("adv_corr") is not None:
                    self.conflict.update(self._corr({r["reward"]: r for r in self.rows if r["step"] == row["step"]}))

    def add(self, step: int, per_reward: dict[str, dict[str, Any]], scalars: dict[str, Any],
            step_adv_abs: list[float]) -> list[str]:
        """Add one step's rows (and send them to the loggers); returns the warning lines of the stalls
        that begin at this step (the stall watch's onsets)."""
        flags, warnings = {}, []
        if self.stall is not None:
            result = self._watch(per_reward)
            flags = dict(zip(self.stall.rewards, (bool(f) for f in result.flags)))
            warnings = [onset_message(self.stall, step, result, i) for i in map(int, result.onsets.nonzero()[0])]
        conflict = {}
        if self.conflict is not None:
            corr = self._corr(per_reward)
            warnings += self.conflict.update(corr)
            conflict = self.conflict.scalars(corr)
        for reward, values in per_reward.items():
            self.rows.append({"step": step, "reward": reward, **values, "stall": flags.get(reward), **scalars,
                              "step_adv_abs": step_adv_abs})
        if self.loggers:
            self.loggers.scalars(step, {**logged_scalars(per_reward, scalars, flags), **conflict})
        return warnings

    def _corr(self, per_reward: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """The advantage correlations [m, m] of one step's rows (``adv_corr``, in the watch's reward order)."""
        names = self.conflict.rewards
        return np.array([[np.nan if v is None else float(v) for v in (per_reward[r].get("adv_corr") or
                                                                      [None] * len(names))] for r in names])

    def _watch(self, per_reward: Mapping[str, Mapping[str, Any]]) -> StallStep:
        """Feed the stall watch one step: each reward's mean and within-group std (NaN where not recorded)."""
        def value(reward: str, key: str) -> float:
            found = per_reward[reward].get(key)
            return np.nan if found is None else float(found)

        names = self.stall.rewards
        return self.stall.update([value(r, "reward_mean") for r in names], [value(r, "reward_group_std") for r in names])

    def write(self) -> None:
        write_metrics(self.path, self.rows, self.config)

    def log_weights(self, step: int, W: np.ndarray, rewards: Sequence[str], trained: int) -> None:
        """W as a heatmap (``weights/W``), once per start of the run."""
        if self.loggers:
            self.loggers.drawn("the W heatmap", lambda: self.loggers.image(
                step, "weights/W", weights_heatmap(W, rewards, trained),
                f"T'·W: {len(rewards)} rewards × {W.shape[1]} steps, T' = {trained} trained"))

    def log_samples(self, step: int, decode: Callable, final: Any, prompts: Sequence[str], rewards: Any,
                    names: Sequence[str], group_size: int) -> None:
        """This process's samples of ``step``: the first image of each group in a grid under its prompt and
        scores (``samples``); samples that are not images (the 1-D worlds) as a histogram (``samples/x0``).

        ``final``: the final states x_0 [B, …]; ``decode``: the policy's; ``rewards``: [B, m]."""
        if self.loggers:
            self.loggers.drawn(f"the samples of step {step}",
                               lambda: self._samples(step, decode, final, prompts, rewards, names, group_size))

    def _samples(self, step: int, decode: Callable, final: Any, prompts: Sequence[str], rewards: Any,
                 names: Sequence[str], group_size: int) -> None:
        import torch

        picks = grid_picks(len(prompts), group_size)
        with torch.no_grad():
            decoded = decode(final[picks])
            if not is_image_batch(decoded):
                self.loggers.histogram(step, "samples/x0", decode(final).float().cpu().numpy().ravel())
                return
        scores = np.asarray(rewards[picks], dtype=np.float64)
        chosen = [prompts[k] for k in picks]
        caption = "\n".join(f"{p} | " + ", ".join(f"{n} {v:.4g}" for n, v in zip(names, row))
                             for p, row in zip(chosen, scores))
        self.loggers.image(step, "samples", sample_grid(decoded.float().cpu().numpy(), chosen, scores, names), caption)

    def close(self) -> None:
        self.loggers.close()


def logged_scalars(per_reward: dict[str, dict[str, Any]], scalars: dict[str, Any],
                   stalls: Mapping[str, bool] | None = None) -> dict[str, float]:
    """The scalars of one step under their logger names: ``train/NAME`` for every step scalar (aggregate,
    losses, KL, clip fraction, grad norm, lr, images, the seconds of each phase), ``reward/NAME`` the
    mean of reward NAME and ``reward_std/NAME`` its standard deviation over the step's images, and
    ``stall/NAME`` 1 where the stall detector flags reward NAME, else 0 (only while it watches)."""
    values = {f"train/{name}": float(value) for name, value in scalars.items()}
    for reward, row in per_reward.items():
        values[f"reward/{reward}"] = float(row["reward_mean"])
        values[f"reward_std/{reward}"] = float(row["reward_std"])
    for reward, flag in (stalls or {}).items():
        values[f"stall/{reward}"] = float(flag)
    return values


def step_metrics(cfg, W, lam, trained: int, all_rewards, adv, stats: dict[str, float], lr: float, *,
                 sample_s: float, update_s: float) -> dict[str, Any]:
    """One step's metrics rows from its gathered rewards [P·G, m] and advantages A_i [P·G, m].

    ``adv_abs`` of reward i at step t is the mean |T'·W_{i,t}·A_i| (its share of E13's A_t);
    ``step_adv_abs`` the mean |A_t| after clipping; ``aggregate`` Σ_i λ_i·mean r_i;
    ``reward_group_std`` the within-group std pooled over the groups (the stall detector's scale);
    ``adv_corr`` each reward's advantage correlation with every reward of the run (``train/conflict``).
    """
    from recast_cli.train.objective import step_advantages

    means = all_rewards.mean(dim=0).numpy()
    stds = all_rewards.std(dim=0, unbiased=False).numpy()
    spreads = group_spread(all_rewards.numpy(), cfg.group_size)
    Tw = W * trained
    per_reward = {name: {"reward_mean": float(means[i]), "reward_std": float(stds[i]),
                         "reward_group_std": float(spreads[i]),
                         "adv_abs": (adv[:, i].abs()[:, None] * Tw[i][None, :]).mean(dim=0).tolist()}
                  for i, name in enumerate(cfg.rewards)}
    corr = advantage_correlation(adv.numpy())
    for i, name in enumerate(cfg.rewards):
        per_reward[name]["adv_corr"] = [None if np.isnan(v) else float(v) for v in corr[i]]
    full_t = step_advantages(adv, W, clip=cfg.adv_clip, trained=trained)
    scalars = {"aggregate": float(np.dot(lam, means)), **stats, "lr": lr,
               "images": int(len(all_rewards)), "sample_s": sample_s, "update_s": update_s}
    return {"per_reward": per_reward, "scalars": scalars, "step_adv_abs": full_t.abs().mean(dim=0).tolist()}


class PlainProgress:
    """One plain line per training step, where stderr is not a terminal (a batch job's log, ``make all``):
    the step, the aggregate and each reward's batch mean, kl, seconds per step and the time left, from the
    steps this process ran."""

    def __init__(self, goal: int, start: int, clock: Callable[[], float] | None = None):
        import time

        self.goal, self.start = goal, start
        self.clock = clock or time.perf_counter
        self.t0 = self.clock()

    def line(self, step: int, per_reward: Mapping[str, Mapping[str, Any]], scalars: Mapping[str, Any]) -> str:
        per_step = (self.clock() - self.t0) / max(step - self.start, 1)
        rewards = ", ".join(f"{name} {float(v['reward_mean']):.4f}" for name, v in per_reward.items())
        return (f"train step {step}/{self.goal}  reward {float(scalars['aggregate']):.4f} ({rewards})  "
                f"kl {float(scalars['kl']):.2e}  {per_step:.2f} s/step  left {clock_text(per_step * (self.goal - step))}")


def clock_text(seconds: float) -> str:
    """``1h02m``, ``4m05s`` or ``12s``."""
    s = max(int(round(seconds)), 0)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"

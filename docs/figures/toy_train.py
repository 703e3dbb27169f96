"""The toy training figure: training curves of recast train runs and a held-fixed before/after check.

    python docs/figures/toy_train.py RUN [RUN ...] --out docs/figures/toy-train.png [--n 4]

For every run: the aggregate reward Σλ·r per training step (and its mean over each epoch of
the 24 toy prompts), then the toy rewards of deterministic ODE samples (24 prompts × n seeds,
the same seeds for every model) at the base model and at the run's last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch


def ode_rewards(run: Path | None, n: int, setting: str = "toy") -> dict[str, float]:
    from recast_cli.rewards import build_scorer
    from recast_cli.settings import build_policy, load_setting
    from recast_cli.toy.renderer import all_prompts
    from recast_cli.train.params import load_lora_into_policy

    policy = build_policy(load_setting(setting).policy, device="cpu")
    if run is not None:
        load_lora_into_policy(policy, run)
    prompts = [p for p in all_prompts() for _ in range(n)]
    seeds = torch.arange(len(prompts)) % n + 10_000  # held-out seeds, the same for every model
    with torch.no_grad():
        traj = policy.sample(policy.encode_prompts(prompts), 0.0, seeds, keep_log_probs=False)
        images = policy.decode(traj.states[:, -1])
    names = ("toy_color", "toy_shape", "toy_sharpness")
    return {name: float(np.mean(build_scorer(name).score(images, prompts))) for name in names}


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=4)
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    summary = {"base": ode_rewards(None, args.n)}
    for run in args.runs:
        m = pd.read_parquet(run / "metrics.parquet")
        per_step = m.groupby("step")["aggregate"].first()
        record = json.loads((run / "run.json").read_text())
        per_epoch = per_step.groupby((per_step.index - 1) // 3).mean()  # 3 steps × 8 prompts = one epoch of 24
        line, = ax.plot(per_step.index, per_step.values, alpha=0.35, label=f"{run.name} ({record['mode']}) per step")
        ax.plot(per_epoch.index * 3 + 2, per_epoch.values, color=line.get_color(), lw=2, marker="o",
                label=f"{run.name} epoch mean")
        summary[run.name] = ode_rewards(run, args.n)
    ax.set_xlabel("training step")
    ax.set_ylabel("aggregate reward Σλ·r (training samples)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    for name, values in summary.items():
        values["aggregate"] = sum(values.values())
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

"""Exploratory, written after the results (not pre-registered): does `recast train`'s stall detector
say which seeds will lose a reward?

    python docs/results/ladder/explore_stalls.py     # reads data/, writes stalls.md beside this file

For every seed of every (world, arm, rate) it runs the detector of ``recast train`` (its defaults:
``recast_cli.train.stall``) on the seed's per-step training batch means and within-group spreads
(``data/<world>-train.parquet``), exactly as the study report does, and sets the flags against the
pre-registered outcome (a reward lost: its final ODE gain below δ = 0.25 of its headroom; analyse.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import analyse
from recast_cli.train.stall import DEFAULT_WINDOW, initial_scale, stall_flags, stall_onsets

HERE = Path(__file__).resolve().parent


def flags(world: str, rewards: list[str]) -> pd.DataFrame:
    """One row per (arm, rate, seed, reward): ever stalled, stalled at the end, the first onset (step, 1-based)."""
    train = pd.read_parquet(HERE / "data" / f"{world}-train.parquet")
    rows = []
    for (arm, rate), cell in train.groupby(["arm", "rate"]):
        means = cell.pivot_table(index=["seed", "step"], columns="reward", values="value")[rewards]
        spreads = cell.pivot_table(index=["seed", "step"], columns="reward", values="spread")[rewards]
        seeds = means.index.get_level_values("seed").unique()
        steps = means.index.get_level_values("step").nunique()
        m = means.to_numpy().reshape(len(seeds), steps, len(rewards))
        s = spreads.to_numpy().reshape(len(seeds), steps, len(rewards))
        scale = initial_scale(s, DEFAULT_WINDOW)
        stalled = stall_flags(m, scale, spreads=s)
        onsets = stall_onsets(m, scale, spreads=s)
        for k, seed in enumerate(seeds):
            for i, r in enumerate(rewards):
                first = np.flatnonzero(onsets[k, :, i])
                rows.append((arm, rate, seed, r, bool(stalled[k, :, i].any()), bool(stalled[k, -1, i]),
                             int(first[0]) + 1 if first.size else 0))
    return pd.DataFrame(rows, columns=["arm", "rate", "seed", "reward", "ever", "end", "onset"])


def main() -> None:
    lines = ["# Exploratory: the stall detector against the lost-reward outcome", "",
             "Written by `explore_stalls.py` after the results, from `data/` (not pre-registered). Per world "
             "and reward, over every arm, rate and seed: how often `recast train`'s stall detector (its "
             "defaults: window 10, threshold 0.2, smoothing 5) flagged the reward at some step, how often "
             "the reward ended the run stalled, and how both set against the pre-registered outcome (the "
             "reward lost: final ODE gain below 0.25 of its headroom).", "",
             "| world | reward | runs | lost | flagged at some step | first onset (median step) | "
             "ended stalled | lost among ended stalled | ended stalled among lost |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for world in analyse.WORLDS:
        table, rewards, _ = analyse.seed_table(world)
        f = flags(world, rewards)
        lost = table[["arm", "rate", "seed", *(f"lost_{r}" for r in rewards)]].melt(id_vars=["arm", "rate", "seed"], value_vars=[f"lost_{r}" for r in rewards],
                          var_name="reward", value_name="lost")
        lost["reward"] = lost["reward"].str.removeprefix("lost_")
        both = f.merge(lost, on=["arm", "rate", "seed", "reward"], validate="one_to_one")
        for r in rewards:
            b = both[both["reward"] == r]
            n, k = len(b), int(b["lost"].sum())
            ended = b[b["end"]]
            onset = b.loc[b["onset"] > 0, "onset"]
            ppv = f"{int(ended['lost'].sum())}/{len(ended)}" if len(ended) else "—"
            sens = f"{int(b.loc[b['lost'], 'end'].sum())}/{k}" if k else "—"
            lines.append(f"| {world} | {r} | {n} | {k} | {int(b['ever'].sum())} | "
                         f"{int(onset.median()) if len(onset) else '—'} | {int(b['end'].sum())} | {ppv} | {sens} |")
    (HERE / "stalls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

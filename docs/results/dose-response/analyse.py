"""The pre-registered analysis of the dose-response study (preregistration.md, "Predictions").

    python docs/results/dose-response/analyse.py [ROOT]     # ROOT: artifacts/dose (one folder per world)

Reads every world's ``recast.cell/1`` tables, computes the pre-registered endpoint per seed (the
mean over the ten SDE checkpoints of the mean reward (1/m)·Σ_i r_i), and writes ``results.md``
beside this file: P1–P4 with their intervals, then every contrast of every world and G
(exploratory), each arm's mean, and the mechanism. Nothing here is tuned on the results: the
statistics are the ones the pre-registration names.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
WORLDS = {"m2": 2, "m3": 3, "m4": 4, "control": None}
MARGIN = 0.01


def endpoints(root: Path) -> dict:
    """(world, arm, G) → {seed: endpoint}; and (world, arm, G) → the cell (for the mechanism)."""
    from recast_cli.artifacts import read_cell
    from recast_cli.report.statistics import primary

    values, cells = {}, {}
    for world in WORLDS:
        for path in sorted((root / world / "cells").glob("*.parquet")):
            cell = read_cell(path)
            key = (world, cell.label, cell.meta["group_size"])
            total = float(np.sum(cell.meta["lambda"]))
            values[key] = {s: primary(cell.curve(s)) / total for s in cell.seeds}
            cells[key] = cell
    return values, cells


def paired(values, world: str, arm: str, g: int, base: str = "static") -> np.ndarray:
    a, b = values[(world, arm, g)], values[(world, base, g)]
    return np.array([a[s] - b[s] for s in sorted(a) if s in b])


def interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def fmt(x: float) -> str:
    return f"{x:+.4f}"


def main(root: Path) -> None:
    values, cells = endpoints(root)
    out = ["# Dose-response study: results\n",
           "Written by `analyse.py` from the cells in `artifacts/dose/` (the reports of `recast study` per world are "
           "in the folders beside this file). Endpoint: per seed, the mean over the ten SDE checkpoints of the mean "
           "reward (1/m)·Σ_i r_i; contrasts paired per seed. Every number below is one the pre-registration named.\n",
           "## Predictions\n", "| prediction | contrast | seeds | mean | interval | verdict |", "|---|---|---:|---:|---:|---|"]
    # P1
    d = paired(values, "m2", "recast-power", 16)
    m, lo, hi = interval(d)
    out.append(f"| P1: ReCAST-power > static (m = 2, G = 16) | recast-power − static | {len(d)} | {fmt(m)} | "
               f"95% [{fmt(lo)}, {fmt(hi)}] | {'holds' if lo > 0 else ('refuted (below 0)' if hi < 0 else 'not supported (contains 0)')} |")
    # P2: OLS of per-seed differences on m
    xs, ys = [], []
    for world, mm in WORLDS.items():
        if mm is None:
            continue
        dd = paired(values, world, "recast-power", 16)
        xs += [mm] * len(dd)
        ys += list(dd)
    res = stats.linregress(xs, ys)
    half = stats.t.ppf(0.975, len(xs) - 2) * res.stderr
    out.append(f"| P2: the gap grows with m (G = 16) | slope of recast-power − static on m | {len(xs)} | "
               f"{fmt(res.slope)} per reward | 95% [{fmt(res.slope - half)}, {fmt(res.slope + half)}] | "
               f"{'holds' if res.slope - half > 0 else ('refuted (below 0)' if res.slope + half < 0 else 'not supported (contains 0)')} |")
    # P3
    d = paired(values, "m2", "reversed-power", 16)
    m, lo, hi = interval(d)
    out.append(f"| P3: reversed < static (m = 2, G = 16) | reversed-power − static | {len(d)} | {fmt(m)} | "
               f"95% [{fmt(lo)}, {fmt(hi)}] | {'holds' if hi < 0 else ('refuted (above 0)' if lo > 0 else 'not supported (contains 0)')} |")
    # P4: TOST
    d = paired(values, "control", "recast-power-estimate", 16)
    m, lo, hi = interval(d, 0.90)
    out.append(f"| P4: estimated-gain ReCAST ≈ static in the control (G = 16), margin ±{MARGIN} | "
               f"recast-power-estimate − static | {len(d)} | {fmt(m)} | 90% [{fmt(lo)}, {fmt(hi)}] | "
               f"{'equivalent (TOST, α = 0.05)' if -MARGIN < lo and hi < MARGIN else 'not shown equivalent'} |")
    out.append("")
    # exploratory: every contrast
    out.append("## Every contrast (exploratory)\n")
    out.append("| world | G | contrast | seeds | mean | 95% t-interval | ahead/behind |")
    out.append("|---|---:|---|---:|---:|---:|---:|")
    pairs = [("recast-exp", "static"), ("recast-power", "static"), ("reversed-power", "static"),
             ("recast-power-estimate", "static"), ("recast-exp", "recast-power"),
             ("recast-power-estimate", "recast-power")]
    for world in WORLDS:
        for g in (4, 16):
            for arm, base in pairs:
                if (world, arm, g) not in values or (world, base, g) not in values:
                    continue
                d = paired(values, world, arm, g, base)
                m, lo, hi = interval(d)
                out.append(f"| {world} | {g} | {arm} − {base} | {len(d)} | {fmt(m)} | [{fmt(lo)}, {fmt(hi)}] | "
                           f"{int((d > 0).sum())}/{int((d < 0).sum())} |")
    out.append("")
    out.append("G = 4 against G = 16 (the gap recast-power − static at G = 4 minus at G = 16, paired per seed):\n")
    out.append("| world | seeds | mean | 95% t-interval |")
    out.append("|---|---:|---:|---:|")
    for world in WORLDS:
        if (world, "recast-power", 4) in values:
            d4, d16 = paired(values, world, "recast-power", 4), paired(values, world, "recast-power", 16)
            d = d4 - d16
            m, lo, hi = interval(d)
            out.append(f"| {world} | {len(d)} | {fmt(m)} | [{fmt(lo)}, {fmt(hi)}] |")
    out.append("")
    out.append("## Every arm: mean endpoint ± sd over seeds, and the mechanism\n")
    out.append("| world | G | arm | lr | seeds | endpoint | final SDE mean reward | clip fraction | |E g₁|² | E|g₁ − E g₁|² |")
    out.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for (world, arm, g), per_seed in sorted(values.items(), key=lambda kv: (list(WORLDS).index(kv[0][0]), kv[0][2], kv[0][1])):
        cell = cells[(world, arm, g)]
        v = np.array(list(per_seed.values()))
        sde = [k for k, (_, sampler) in enumerate(cell.points) if sampler == "sde"]
        last = max(sde, key=lambda k: cell.points[k][0])
        final = cell.evals[:, last, -1].mean() / float(np.sum(cell.meta["lambda"]))
        grad = cell.meta["gradient"]
        out.append(f"| {world} | {g} | {arm} | {cell.meta['train']['learning_rate']:g} | {len(v)} | "
                   f"{v.mean():.4f} ± {v.std(ddof=1):.4f} | {final:.4f} | {cell.train['clip_frac'].mean():.4f} | "
                   f"{grad['mean_sq_norm']:.3g} | {grad['spread']:.3g} |")
    (HERE / "results.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "artifacts" / "dose")

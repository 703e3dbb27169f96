"""``recast compare-gains``: how much two gain tables agree, per reward (the paper's Table 5).

The paper measures surrogate sensitivity by estimating the gains once with GPT Image
positives and once with Nano Banana Pro positives. For each reward both tables hold, on the
same grid: the Pearson and the Spearman correlation of the per-step gains ΔD_{i,t} (E5), the
peak step of each curve, and the ratio of total gains Σ_t ΔD (B over A; the totals are
D_{i,0} when the gains telescope). A correlation is undefined (None) when a curve is constant.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from scipy.stats import rankdata

from recast_cli.artifacts import read_gains
from recast_cli.errors import BadInput


def correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's r; None when either series is constant."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    norm = np.sqrt((x * x).sum() * (y * y).sum())
    return None if norm == 0 else float(np.clip((x * y).sum() / norm, -1.0, 1.0))


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's ρ: Pearson's r of the ranks (ties get their mean rank)."""
    return correlation(rankdata(x), rankdata(y))


def compare_gains(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> dict[str, Any]:
    """Per-reward agreement of the gain curves of two ``recast.gains/1`` tables on one grid."""
    ta, tb = read_gains(a), read_gains(b)
    if ta.T != tb.T or not np.allclose(ta.sigmas, tb.sigmas, rtol=0, atol=1e-9):
        raise BadInput(f"{a} (T = {ta.T}) and {b} (T = {tb.T}) are on different σ grids; "
                       f"compare tables estimated on one grid")
    common = [r for r in ta.rewards if r in tb.rewards]
    if not common:
        raise BadInput(f"{a} ({', '.join(ta.rewards)}) and {b} ({', '.join(tb.rewards)}) share no reward")
    rows = []
    for reward in common:
        ga, gb = ta.gain[ta.rewards.index(reward)], tb.gain[tb.rewards.index(reward)]
        total_a, total_b = float(ga.sum()), float(gb.sum())
        rows.append({
            "reward": reward,
            "pearson": correlation(ga, gb),
            "spearman": rank_correlation(ga, gb),
            "peak_t_a": int(ga.argmax()) + 1,
            "peak_t_b": int(gb.argmax()) + 1,
            "total_a": total_a,
            "total_b": total_b,
            "ratio": None if total_a == 0 else total_b / total_a,
        })
    return {
        "a": str(a), "b": str(b), "T": ta.T, "rewards": rows,
        "only_in_a": [r for r in ta.rewards if r not in tb.rewards],
        "only_in_b": [r for r in tb.rewards if r not in ta.rewards],
    }

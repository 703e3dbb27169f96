"""Which rewards conflict, and at which steps (E14, docs/trust.md): the gain table's per-step advantage
correlations read as conflicts on W's grid, and the columns where W gives one of a conflicting pair most of
the step's weight (where ReCAST settles the conflict by timing rather than by λ)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A pair conflicts at a step when ρ is below −CONFLICT_RHO and the upper end of its 95 % interval below 0.
CONFLICT_RHO = 0.1
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Conflict:
    """Rewards ``pair`` conflict at ``steps`` of W's grid; ``rho`` the lowest correlation among them."""

    pair: tuple[str, str]
    steps: tuple[int, ...]
    rho: float

    def to_json(self) -> dict[str, Any]:
        return {"pair": list(self.pair), "steps": list(self.steps), "rho_min": self.rho}


def rho_upper(rho: float, groups: int, k: int) -> float:
    """The upper end of ρ's 95 % interval (Fisher z, n = groups·(K − 1) degrees of freedom)."""
    n = groups * max(k - 1, 1)
    if n <= 3 or rho <= -1:
        return 1.0 if n <= 3 else -1.0
    return math.tanh(math.atanh(min(rho, 1 - 1e-15)) + Z95 / math.sqrt(n - 3))


def conflict_steps(corr: dict[str, Any], threshold: float = CONFLICT_RHO) -> list[tuple[tuple[str, str], np.ndarray,
                                                                                       np.ndarray]]:
    """Per pair of the E14 record ``corr``: (pair, ρ [T] with NaN where null, conflict mask [T]) on the table's grid."""
    out = []
    groups, k = int(corr["n"]), int(corr.get("K", 2))
    for pair, row in zip(corr["pairs"], corr["rho"]):
        rho = np.array([np.nan if v is None else float(v) for v in row])
        mask = np.array([bool(np.isfinite(r) and r < -threshold and rho_upper(r, groups, k) < 0) for r in rho])
        out.append(((str(pair[0]), str(pair[1])), rho, mask))
    return out


def to_grid(mask: np.ndarray, sigmas: np.ndarray, new_sigmas: np.ndarray) -> np.ndarray:
    """A per-step mask of the grid ``sigmas`` (σ_0 … σ_T, increasing) on the grid ``new_sigmas``: a new step
    (σ'_{t-1}, σ'_t] is marked when it overlaps a marked step (σ_{s-1}, σ_s]."""
    if np.array_equal(sigmas, new_sigmas):
        return mask.copy()
    out = np.zeros(len(new_sigmas) - 1, dtype=bool)
    for s in np.nonzero(mask)[0]:
        lo, hi = sigmas[s], sigmas[s + 1]
        out |= (new_sigmas[:-1] < hi) & (new_sigmas[1:] > lo)
    return out


def conflicts_on_grid(corr: dict[str, Any] | None, sigmas: np.ndarray, new_sigmas: np.ndarray,
                      threshold: float = CONFLICT_RHO) -> list[Conflict]:
    """The pairs that conflict at some step of W's grid ``new_sigmas`` (steps numbered 1 … T)."""
    if not corr:
        return []
    out = []
    for pair, rho, mask in conflict_steps(corr, threshold):
        on_grid = to_grid(mask, sigmas, new_sigmas)
        if on_grid.any():
            out.append(Conflict(pair, tuple(int(t) + 1 for t in np.nonzero(on_grid)[0]), float(np.nanmin(rho[mask]))))
    return out


def dominated_steps(W: np.ndarray, rewards: tuple[str, ...], pair: tuple[str, str], steps: tuple[int, ...]) -> list[int]:
    """Of ``steps`` (1 … T), those where W gives one reward of ``pair`` more than half of the column."""
    i, j = rewards.index(pair[0]), rewards.index(pair[1])
    out = []
    for t in steps:
        column = W[:, t - 1]
        total = column.sum()
        if total > 0 and max(column[i], column[j]) > 0.5 * total:
            out.append(t)
    return out


def settled_by_timing(W: np.ndarray, rewards: tuple[str, ...], conflicts: list[Conflict]) -> list[dict[str, Any]]:
    """The conflicts W settles by timing: for each conflicting pair, the conflict steps where W gives one of the
    two most of the column (and which one)."""
    out = []
    for c in conflicts:
        steps = dominated_steps(W, rewards, c.pair, c.steps)
        if steps:
            i, j = rewards.index(c.pair[0]), rewards.index(c.pair[1])
            owner = [c.pair[0] if W[i, t - 1] >= W[j, t - 1] else c.pair[1] for t in steps]
            out.append({"pair": list(c.pair), "steps": steps, "owner": owner})
    return out


def conflict_message(pair: tuple[str, str] | list[str], steps: list[int], source: str) -> str:
    """The one warning line of a conflict W settles by timing."""
    return (f"rewards {pair[0]} and {pair[1]} conflict at steps {compact_steps(steps)} ({source}) and W gives one of "
            f"them most of those steps; ReCAST will settle it by timing, not by λ (docs/trust.md)")


def compact_steps(steps: list[int] | tuple[int, ...]) -> str:
    """1, 2, 3, 7 → '1–3, 7'."""
    parts, run = [], []
    for t in sorted(steps):
        if run and t == run[-1] + 1:
            run.append(t)
            continue
        if run:
            parts.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [t]
    if run:
        parts.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)

"""The report's numbers: means ± std over seeds, wins, Pareto verdicts, curve endpoints, paired contrasts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from recast_cli.artifacts import CurveTable
from recast_cli.errors import BadInput
from recast_cli.report.inputs import MODE_LABEL, ARM_ORDER, Budget, Curve, Evaluation, budget_label

VERDICT_TIE = "equal"
CONTRASTS = ("recast", "reversed", "nosink")


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (ddof 1) of per-seed values; std None for a single value."""

    mean: float
    std: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        arr = np.asarray(values, dtype=np.float64)
        return cls(float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else None)


def pareto(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """ReCAST vs static over the per-scorer means: dominates, is dominated, trade-off or equal."""
    ours_arr, theirs_arr = np.asarray(ours), np.asarray(theirs)
    if np.array_equal(ours_arr, theirs_arr):
        return VERDICT_TIE
    if np.all(ours_arr >= theirs_arr):
        return "ReCAST ≻ static"
    if np.all(ours_arr <= theirs_arr):
        return "static ≻ ReCAST"
    return "trade-off"


def win_rate(verdicts: Sequence[str], side: str) -> float:
    """The win rate of ``side`` ('a' or 'b') over all verdicts: (wins + ½·ties) / verdicts."""
    wins = sum(v == side for v in verdicts) + 0.5 * sum(v == "tie" for v in verdicts)
    return wins / len(verdicts)


class Grid:
    """Per-evaluation means keyed by (mode, λ, seed), and the base model's means per λ (docs/method.md §7)."""

    def __init__(self, evals: Sequence[Evaluation]):
        trained = [e for e in evals if e.mode != "base"]
        self.cells = {(e.mode, e.budget, e.seed): e.means() for e in trained}
        self.budgets = sorted({e.budget for e in trained})
        self.modes = [m for m in ARM_ORDER if any(e.mode == m for e in trained)]
        base = [e for e in evals if e.mode == "base"]
        self.base = {b: base[0].means(b) for b in self.budgets} if base and self.budgets else {}
        self.rewards = list(evals[0].table.meta["rewards"]) if evals else []
        judges = [list(e.table.meta.get("judges") or ()) for e in trained]
        self.judges = [j for j in judges[0] if all(j in js for js in judges)] if judges else []
        self.dropped_judges = sorted({j for js in judges for j in js} - set(self.judges))

    def seeds(self, mode: str, budget: Budget | None = None) -> list[int]:
        return sorted({s for (m, b, s) in self.cells if m == mode and (budget is None or b == budget)},
                      key=lambda s: (s is None, s))

    def stat(self, mode: str, scorer: str, budget: Budget) -> Stat | None:
        """Mean ± std over the seeds of one λ."""
        values = [self.cells[(mode, budget, s)][scorer] for s in self.seeds(mode, budget)]
        return Stat.of(values) if values else None

    def pooled(self, mode: str, scorer: str) -> Stat | None:
        """Mean ± std over seeds of each seed's mean over the λ it was evaluated at (Tables 1, 2)."""
        per_seed = []
        for s in self.seeds(mode):
            values = [self.cells[(mode, b, s)][scorer] for b in self.budgets if (mode, b, s) in self.cells]
            per_seed.append(float(np.mean(values)))
        return Stat.of(per_seed) if per_seed else None

    def base_value(self, scorer: str) -> Stat | None:
        if not self.base or scorer not in self.base[self.budgets[0]]:
            return None
        return Stat(float(np.mean([self.base[b][scorer] for b in self.budgets])), None)

    def matched(self) -> list[tuple[Budget, int]]:
        """The (λ, seed) pairs with both a static and a ReCAST evaluation."""
        return sorted((b, s) for (m, b, s) in self.cells if m == "recast" and ("static", b, s) in self.cells)

    def wins(self, scorer: str) -> tuple[int, int]:
        pairs = self.matched()
        won = sum(self.cells[("recast", b, s)][scorer] > self.cells[("static", b, s)][scorer] for b, s in pairs)
        return won, len(pairs)

    def values(self, scorer: str) -> list[float]:
        """Every mean of ``scorer`` in the grid, the base model's included."""
        return [c[scorer] for c in self.cells.values() if scorer in c] + \
            [c[scorer] for c in self.base.values() if scorer in c]

    def missing(self) -> list[str]:
        """The (mode, λ, seed) evaluations an incomplete grid lacks."""
        seeds = sorted({s for (_, _, s) in self.cells}, key=lambda s: (s is None, s))
        return [f"{MODE_LABEL[m]} λ = {budget_label(b)} seed {s}" for m in self.modes for b in self.budgets
                for s in seeds if (m, b, s) not in self.cells]


# --------------------------------------------------------------------------- the 1-D world's endpoints


def primary(curve: CurveTable) -> float | None:
    """Mean aggregate over the run's SDE checkpoints (None when it has none)."""
    values = [curve.mean[k, -1] for k, (step, sampler) in enumerate(curve.points) if sampler == "sde" and step > 0]
    return float(np.mean(values)) if values else None


def secondary(curve: CurveTable) -> float | None:
    """The aggregate at the run's last ODE point (None when it has none)."""
    odes = [(step, k) for k, (step, sampler) in enumerate(curve.points) if sampler == "ode" and step > 0]
    return float(curve.mean[max(odes)[1], -1]) if odes else None


def endpoint_grid(curves: Sequence[Curve], endpoint: Callable[[CurveTable], float | None]) \
        -> dict[tuple[str, Budget, int], float]:
    """(mode, λ, seed) → the endpoint of that run (the curve tables of one run are merged)."""
    grid: dict[tuple[str, Budget, int], float] = {}
    for c in curves:
        if c.mode == "base":
            continue
        value = endpoint(c.table)
        if value is not None:
            key = (c.mode, c.budget, int(c.seed))
            if key in grid:
                raise BadInput(f"{c.name}: a second table with this endpoint for {MODE_LABEL[c.mode]} "
                               f"λ = {budget_label(c.budget)} seed {c.seed}")
            grid[key] = value
    return grid


@dataclass(frozen=True)
class Contrast:
    """An arm − static, one paired difference per seed, and what is said of them over seeds."""

    mode: str
    diffs: np.ndarray  # per seed

    @property
    def mean(self) -> float:
        return float(self.diffs.mean())

    @property
    def sd(self) -> float:
        """The sample sd (ddof 1); NaN for a single seed."""
        return float(self.diffs.std(ddof=1)) if len(self.diffs) > 1 else float("nan")

    def t_interval(self) -> tuple[float, float] | None:
        """The 95% t-interval of the mean difference (None for a single seed)."""
        from scipy import stats

        n = len(self.diffs)
        if n < 2:
            return None
        mean = self.mean
        half = float(stats.t.ppf(0.975, n - 1) * self.sd / math.sqrt(n))
        return mean - half, mean + half

    def sign_test(self) -> tuple[int, int, float]:
        """Seeds ahead, seeds behind (ties dropped) and the two-sided sign test's p (NaN when all tie)."""
        from scipy import stats

        wins, losses = int((self.diffs > 0).sum()), int((self.diffs < 0).sum())
        p = stats.binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else float("nan")
        return wins, losses, p


def contrasts(grid: dict[tuple[str, Budget, int], float], arms: Sequence[str] = CONTRASTS) \
        -> tuple[list[Contrast], list[str]]:
    """Arm − static per seed for each of ``arms`` (the paper's modes, or a study's arm labels), each
    seed's value the mean over the budgets both arms have; a note for every seed paired with static
    at fewer than all the budgets. ``grid``: (arm, λ, seed) → the seed's endpoint. The one place the
    report of runs (``report/curves``) and of a study's cells (``report/cells``) pair arms."""
    budgets = sorted({b for (_, b, _) in grid})
    out, notes = [], []
    for mode in arms:
        seeds = sorted({s for (m, _, s) in grid if m == mode})
        diffs = []
        for s in seeds:
            shared = [b for b in budgets if (mode, b, s) in grid and ("static", b, s) in grid]
            if len(shared) < len(budgets):
                notes.append(f"{MODE_LABEL.get(mode, mode)} seed {s}: {len(shared)} of {len(budgets)} budgets "
                             "paired with static")
            if shared:
                diffs.append(np.mean([grid[(mode, b, s)] - grid[("static", b, s)] for b in shared]))
        if diffs:
            out.append(Contrast(mode, np.array(diffs)))
    return out, notes

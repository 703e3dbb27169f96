"""A reward of the 1-D analytic world: a step function of x_0, constant on cells of the line.

A :class:`StepReward` is explicit cells (edges and one value per cell) or periodic cells (a cell
width, a phase and a repeating pattern of values). What the exact code needs of it follows in
closed form: r(x_0) in numpy or torch, its cells over a span, and P(r = v) under a Gaussian — a sum
of ndtr differences over the cells that hold v (docs/method.md §4). The world that owns the rewards is
:class:`~recast_cli.policy.world1d.World1D`; a reward's definition is checked with the world's
(:func:`~recast_cli.policy.world_limits.check_reward`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr

#: The support of a Gaussian, in standard deviations either side of its mean (cells are enumerated over it).
REACH = 12


def _mass(lo: float, hi: float, mean: np.ndarray, std: np.ndarray, safe: np.ndarray) -> np.ndarray:
    """P(lo <= x < hi) under N(mean, std²), elementwise; std = 0 is the point mass at ``mean``."""
    smooth = ndtr((hi - mean) / safe) - ndtr((lo - mean) / safe)
    point = ((mean >= lo) & (mean < hi)).astype(np.float64)
    return np.where(std > 0, smooth, point)


@dataclass(frozen=True)
class StepReward:
    """A reward constant on cells of the line; a point on an edge belongs to the cell on its right.

    Explicit cells (``cell`` is None): ``edges`` e_1 < … < e_n and ``values`` v_0 … v_n, v_i on
    [e_i, e_{i+1}) with e_0 = −∞ and e_{n+1} = +∞. Periodic cells (``cell`` > 0): cell k =
    [phase + k·cell, phase + (k + 1)·cell) holds ``values[k mod len(values)]`` for every integer k.
    """

    edges: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    cell: float | None = None
    phase: float = 0.0

    @property
    def levels(self) -> tuple[float, ...]:
        """The distinct values, ascending."""
        return tuple(sorted(set(self.values)))

    def value(self, x0: np.ndarray) -> np.ndarray:
        """r(x_0), float64, any shape; NaN where x_0 is NaN."""
        x0 = np.asarray(x0, dtype=np.float64)
        values = np.asarray(self.values, dtype=np.float64)
        if self.cell is None:
            out = values[np.searchsorted(np.asarray(self.edges, dtype=np.float64), x0, side="right")]
        else:
            k = np.floor((x0 - self.phase) / self.cell)
            finite = np.isfinite(k)
            out = values[np.where(finite, k % len(values), 0).astype(np.int64)]
            out = np.where(finite, out, np.nan)
        return np.where(np.isnan(x0), np.nan, out)

    def value_torch(self, x0):
        """r(x_0) for a torch tensor of any shape: float64 on its device (the same numbers as :meth:`value`)."""
        import torch

        x0 = x0.to(torch.float64)
        values = torch.tensor(self.values, dtype=torch.float64, device=x0.device)
        if self.cell is None:
            edges = torch.tensor(self.edges, dtype=torch.float64, device=x0.device)
            out = values[torch.searchsorted(edges, x0.contiguous(), right=True)]
        else:
            k = torch.floor((x0 - self.phase) / self.cell)
            finite = torch.isfinite(k)
            out = values[torch.where(finite, torch.remainder(k, len(self.values)), 0).to(torch.int64)]
            out = torch.where(finite, out, torch.nan)
        return torch.where(torch.isnan(x0), torch.nan, out)

    def cells(self, lo: float, hi: float) -> Iterator[tuple[float, float, float]]:
        """(start, end, value) of every cell, left to right; periodic cells only those around [lo, hi]."""
        if self.cell is None:
            bounds = (-np.inf, *self.edges, np.inf)
            for i, value in enumerate(self.values):
                yield bounds[i], bounds[i + 1], value
            return
        first = int(np.floor((lo - self.phase) / self.cell)) - 1
        last = int(np.ceil((hi - self.phase) / self.cell)) + 1
        m = len(self.values)
        for k in range(first, last + 1):
            yield self.phase + k * self.cell, self.phase + (k + 1) * self.cell, self.values[k % m]

    def count_cells(self, lo: float, hi: float) -> float:
        """How many cells :meth:`cells` yields over [lo, hi] (a float: inf when absurdly many)."""
        if self.cell is None:
            return float(len(self.values))
        span = (hi - lo) / self.cell
        return span + 4 if math.isfinite(span) else math.inf

    def level_cells(self, lo: float, hi: float) -> dict[float, list[tuple[float, float]]]:
        """value → its cells (start, end) among :meth:`cells` over [lo, hi], left to right: one pass
        over the cells serves every level (a reward may have 10⁴ cells and as many values)."""
        grouped: dict[float, list[tuple[float, float]]] = {}
        for a, b, value in self.cells(lo, hi):
            grouped.setdefault(value, []).append((a, b))
        return grouped

    def held_probabilities(self, mean: np.ndarray, std: np.ndarray, levels) -> Iterator[tuple[int, np.ndarray]]:
        """(i, P(r(x) = levels[i]) under N(mean, std²)) for each level that holds a cell within reach of
        the means, in order, elementwise; std = 0 gives the indicator at ``mean``. Every other level's
        probability is exactly 0 there, and is skipped: the work is that of the cells, however many
        values the reward has (a periodic pattern may hold 10⁴ values, a few of them near the means).

        A sum of ndtr differences over the cells that hold the level, left to right; periodic cells are
        enumerated once, over [min mean − 12·max std, max mean + 12·max std]. One level's array is made
        at a time (a generator), so the memory is that of one level whatever their number.
        """
        mean, std = np.broadcast_arrays(np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64))
        if mean.size == 0:
            return
        safe = np.where(std > 0, std, 1.0)
        grouped = self.level_cells(mean.min() - REACH * std.max(), mean.max() + REACH * std.max())
        for i, level in enumerate(levels):
            if level not in grouped:
                continue
            total = np.zeros(mean.shape)
            for lo, hi in grouped[level]:
                total = total + _mass(lo, hi, mean, std, safe)
            yield i, total

    def probability(self, mean: np.ndarray, std: np.ndarray, level: float) -> np.ndarray:
        """P(r(x) = level) under N(mean, std²), elementwise (:meth:`held_probabilities` of one level, 0
        where it holds no cell near the means)."""
        held = next(self.held_probabilities(mean, std, (level,)), None)
        return held[1] if held is not None else np.zeros(np.broadcast_shapes(np.shape(mean), np.shape(std)))

    def describe(self) -> dict[str, Any]:
        """The definition as JSON (explicit cells, or the periodic cells)."""
        if self.cell is None:
            return {"edges": list(self.edges), "values": list(self.values)}
        return {"cell": self.cell, "phase": self.phase, "pattern": list(self.values)}

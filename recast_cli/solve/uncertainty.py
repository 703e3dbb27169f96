"""How far W can be trusted (docs/trust.md): W solved again on every bootstrap draw of the gains, and what the
spread of those solutions says of each reward's row.

Top to bottom: one W per draw (the same E9-E12 solve as the point W), each row's total-variation distance
to the point W and to static, the verdict per reward (is its timing distinguishable from static at this
estimation budget?), a lower bound on the budget that would resolve it, and E12u's shares γ_i.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recast_cli.artifacts.metadata import RESOLVED, UNRESOLVED  # the verdicts, which W's info checks
from recast_cli.solve.sinkhorn import row_tv, static_weights

#: How far past the 95 % point a row's TV to static must lie to count as resolved: float noise, not a margin.
TIE_TOL = 1e-9
#: The bootstrap quantiles a row's spread is given by: the 90 % range and the median.
LOW_Q, HIGH_Q = 5.0, 95.0


@dataclass(frozen=True)
class RowUncertainty:
    """One reward's row of W against its bootstrap (TV: total variation over the trained steps)."""

    tv_point: tuple[float, float, float]   # TV(W^b_i, W_i): 5 %, median, 95 % over the draws
    tv_static: float                       # TV(W_i, static_i) of the point W
    tv_static_range: tuple[float, float]   # TV(W^b_i, static_i): 5 %, 95 %
    resolved: bool                         # TV(W_i, static_i) > the 95 % point of TV(W^b_i, W_i)
    samples_to_resolve: float | None       # N·(q95 / TV to static)²: a lower bound on the samples per prompt to resolve it

    @property
    def verdict(self) -> str:
        return RESOLVED if self.resolved else UNRESOLVED

    def to_json(self) -> dict:
        return {"tv_point": list(self.tv_point), "tv_static": self.tv_static,
                "tv_static_range": list(self.tv_static_range), "verdict": self.verdict,
                "samples_to_resolve": self.samples_to_resolve}


def bootstrap_weights(draws: np.ndarray, solve: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """W^b for every draw [B, m, T] of the gains: ``solve`` is the point W's own solve (E9-E12), given one draw."""
    return np.stack([solve(d) for d in draws])


def row_uncertainty(W: np.ndarray, draws_W: np.ndarray, lam: np.ndarray, samples: int | None) -> list[RowUncertainty]:
    """Per reward, the spread of its row over the bootstrap's W^b and the verdict on its timing.

    ``W`` [m, T'] and ``draws_W`` [B, m, T'] over the trained steps; ``samples`` = N, the positives per prompt
    the gains were estimated from (None: not a sampled estimate, no budget line).

    The verdict reads the bootstrap as the distribution of W's sampling error: were the true W static,
    TV(W, static) would itself be such an error, below the bootstrap's 95 % point in 95 % of estimates.
    A row further from static than that is "timing resolved". Were W's error that of a mean over N samples,
    it would shrink as 1/√N, and N·(q95/TV to static)² samples per prompt would bring the 95 % point down to
    the distance seen; it shrinks more slowly (measured against the exact W of the analytic worlds: N^-0.4
    with the exp kernel, N^-0.1 with the power kernel, docs/trust.md), so that N is a lower bound.
    """
    static = static_weights(lam, W.shape[1])
    to_point = row_tv(draws_W, W[None])          # [B, m]
    to_static_draws = row_tv(draws_W, static[None])
    to_static = row_tv(W, static)
    out = []
    for i in range(W.shape[0]):
        lo, mid, hi = (float(np.percentile(to_point[:, i], q)) for q in (LOW_Q, 50.0, HIGH_Q))
        s_lo, s_hi = (float(np.percentile(to_static_draws[:, i], q)) for q in (LOW_Q, HIGH_Q))
        d = float(to_static[i])
        need = None
        if samples is not None and d > 0:
            need = float(samples * (hi / d) ** 2)
        # resolved only past float noise: a row at the 95 % point exactly (a tie, met by the flat draws' own
        # TV, rounded either way by the solve and the percentile) is not distinguishable from static
        out.append(RowUncertainty((lo, mid, hi), d, (s_lo, s_hi), d > hi + TIE_TOL * max(hi, 1.0), need))
    return out


def samples_for_spread(rows: list[RowUncertainty], samples: int, target: float) -> float | None:
    """A lower bound on the positives per prompt at which the widest row's median TV to the point W reaches
    ``target``: N·(median / target)², what a 1/√N scaling would give (W's spread shrinks more slowly); None when
    every row is already exact (median 0)."""
    widest = max(r.tv_point[1] for r in rows)
    if widest <= 0:
        return None
    return float(samples * (widest / target) ** 2)


def quantile_band(draws_W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry of W, the 5 % and 95 % points over the bootstrap's W^b: the band ``recast plot`` draws."""
    return np.percentile(draws_W, LOW_Q, axis=0), np.percentile(draws_W, HIGH_Q, axis=0)

"""The analytic world ``gmm1d``: exact Rényi discriminability curves for testing the method.

METHOD.md §4, "The analytic world": π^old = ¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4),
rectified-flow noising x_σ = (1 − σ)x_0 + σε on the linear grid σ_t = t/T, binary rewards
used raw with β = 0.5. The posterior x_0 | x_σ is a Gaussian mixture in closed form, so the
density ratio h_{i,t} (E3) and D_α (E4) are exact up to a 1-D quadrature.

Run ``python -m recast_cli.policy.gmm1d OUT.parquet`` to write the exact ``recast.gains/1``
table (coarse, mid, fine; α = 2; T = 25) shipped as the example in ``pipelines/examples/``.
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.special import ndtr

from recast_cli.artifacts import GainTable, write_gains
from recast_cli.grid import GridSpec

MEANS = np.array([-2.4, -1.6, 1.6, 2.4])
STD = 0.25
BETA = 0.5
REWARDS = ("coarse", "mid", "fine")
FINE_CELL = 0.2


def reward_probability(reward: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """P(r = 1) under N(mean, std²), elementwise; std = 0 gives the reward at ``mean``."""
    mean, std = np.broadcast_arrays(np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64))
    safe = np.where(std > 0, std, 1.0)

    def mass(lo: float | np.ndarray, hi: float | np.ndarray) -> np.ndarray:
        """P(lo <= x < hi)."""
        smooth = ndtr((hi - mean) / safe) - ndtr((lo - mean) / safe)
        point = ((mean >= lo) & (mean < hi)).astype(np.float64)
        return np.where(std > 0, smooth, point)

    if reward == "coarse":
        return mass(0.0, np.inf)
    if reward == "mid":
        return mass(-np.inf, -2.0) + mass(2.0, np.inf)
    if reward == "fine":
        lo = int(np.floor((mean.min() - 12 * std.max()) / FINE_CELL)) - 1
        hi = int(np.ceil((mean.max() + 12 * std.max()) / FINE_CELL)) + 1
        ks = [k for k in range(lo, hi + 1) if k % 2 != 0]
        return sum(mass(k * FINE_CELL, (k + 1) * FINE_CELL) for k in ks)
    raise ValueError(f"gmm1d has no reward {reward!r}; it has {', '.join(REWARDS)}")


def exact_discriminability(reward: str, sigma: float, alpha: float, beta: float = BETA,
                           quad_step: float = 5e-4) -> float:
    """D_α(π⁺_σ ‖ π^old_σ) (E4) for one reward at noise level σ, by quadrature over x_σ.

    h(x) = E[exp(r/β) | x_σ = x] = 1 + (e^{1/β} − 1)·P(r = 1 | x_σ = x) (E3), Z = E[exp(r/β)],
    D_α = 1/(α−1)·log E_{π^old_σ}[(h/Z)^α], and for α = 1 the KL E[(h/Z)·log(h/Z)].
    """
    weights = np.full(len(MEANS), 1.0 / len(MEANS))
    lift = np.expm1(1.0 / beta)
    p_data = float(weights @ reward_probability(reward, MEANS, np.full_like(MEANS, STD)))
    z = 1.0 + lift * p_data
    if sigma == 0.0:
        ratio, prob = np.array([np.exp(1.0 / beta), 1.0]) / z, np.array([p_data, 1.0 - p_data])
    else:
        var_t = (1 - sigma) ** 2 * STD**2 + sigma**2
        reach = (1 - sigma) * np.abs(MEANS).max() + 12 * np.sqrt(var_t)
        x = np.arange(-reach, reach + quad_step, quad_step)
        centred = x[:, None] - (1 - sigma) * MEANS[None, :]
        dens = weights * np.exp(-0.5 * centred**2 / var_t) / np.sqrt(2 * np.pi * var_t)
        marginal = dens.sum(axis=1)
        post_w = dens / marginal[:, None]
        post_mean = MEANS[None, :] + (1 - sigma) * STD**2 / var_t * centred
        post_std = np.full_like(post_mean, STD * sigma / np.sqrt(var_t))
        p_pos = (post_w * reward_probability(reward, post_mean, post_std)).sum(axis=1)
        ratio = (1.0 + lift * p_pos) / z
        prob = marginal * quad_step
    if alpha == 1.0:
        return float(np.sum(prob * ratio * np.log(ratio)))
    return float(np.log(np.sum(prob * ratio**alpha)) / (alpha - 1.0))


def exact_gain_table(rewards: tuple[str, ...] = REWARDS, alpha: float = 2.0, steps: int = 25,
                     beta: float = BETA) -> GainTable:
    """The exact ``recast.gains/1`` table of the gmm1d world (E4, E5) on σ_t = t/T."""
    sigmas = GridSpec("linear").sigmas(steps)
    D = np.array([[exact_discriminability(r, s, alpha, beta) for s in sigmas] for r in rewards])
    gain = D[:, :-1] - D[:, 1:]
    return GainTable(
        rewards=tuple(rewards),
        sigmas=sigmas,
        D=D,
        gain_raw=gain,
        gain=gain,
        meta={
            "alpha": alpha, "beta": beta, "N": None, "K": None, "P": None,
            "sampling": "exact", "crn": None, "monotone": "none",
            "reward_std": {r: 1.0 for r in rewards},
            "policy": {"name": "gmm1d", "means": MEANS.tolist(), "std": STD},
            "positives": {"source": "exact"},
            "grid": GridSpec("linear").to_json(),
        },
    )


if __name__ == "__main__":
    write_gains(sys.argv[1], exact_gain_table(), config={"world": "gmm1d", "exact": True})

"""The analytic world ``gmm1d``: exact Rényi discriminability curves for testing the method.

METHOD.md §4, "The analytic world": π^old = ¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4),
rectified-flow noising x_σ = (1 − σ)x_0 + σε on the linear grid σ_t = t/T, binary rewards
used raw with β = 0.5. The posterior x_0 | x_σ is a Gaussian mixture in closed form, so the
density ratio h_{i,t} (E3) and D_α (E4) are exact up to a 1-D quadrature.

:class:`GMM1DPolicy` is the same world behind the policy protocol: its velocity is the exact
rectified-flow velocity and its rollouts draw the exact posterior x_0 | x_t, so the estimator
(E6–E8) can be run on it and compared with the exact curves. Exact π^old and π⁺ samples
(E2, by rejection) and the three rewards as functions of x_0 complete the world.

Run ``python -m recast_cli.policy.gmm1d OUT.parquet`` to write the exact ``recast.gains/1``
table (coarse, mid, fine; α = 2; T = 25) shipped as the example in ``pipelines/examples/``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import logsumexp, ndtr

from recast_cli.artifacts import GainTable, write_gains
from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.base import FlowPolicy, step_noise
from recast_cli.rewards.base import Scorer

MEANS = np.array([-2.4, -1.6, 1.6, 2.4])
STD = 0.25
BETA = 0.5
REWARDS = ("coarse", "mid", "fine")
#: Every reward of the world: the three of METHOD.md §4 and ``fine_wide`` (odd 0.3-cells), a
#: second clean-end reward whose exact gain peaks at the same step as ``fine``'s (t = 2 of 25)
#: with a wider window: the control pair of the two-timescale study (pipelines/twoscale-control.toml).
ALL_REWARDS = (*REWARDS, "fine_wide")
FINE_CELL = 0.2
CELL = {"fine": FINE_CELL, "fine_wide": 0.3}


def reward_probability(reward: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """P(r = 1) under N(mean, std²), elementwise; std = 0 gives the reward at ``mean``."""
    mean, std = np.broadcast_arrays(np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64))
    safe = np.where(std > 0, std, 1.0)

    def mass(lo: float | np.ndarray, hi: float | np.ndarray) -> np.ndarray:
        """P(lo <= x < hi)."""
        smooth = ndtr((hi - mean) / safe) - ndtr((lo - mean) / safe)
        point = ((mean >= lo) & (mean < hi)).astype(np.float64)
        return np.where(std > 0, smooth, point)

    if check_reward(reward) == "coarse":
        return mass(0.0, np.inf)
    if reward == "mid":
        return mass(-np.inf, -2.0) + mass(2.0, np.inf)
    cell = CELL[reward]
    lo = int(np.floor((mean.min() - 12 * std.max()) / cell)) - 1
    hi = int(np.ceil((mean.max() + 12 * std.max()) / cell)) + 1
    ks = [k for k in range(lo, hi + 1) if k % 2 != 0]  # "fine", "fine_wide": the odd cells
    return sum(mass(k * cell, (k + 1) * cell) for k in ks)


def check_reward(reward: str) -> str:
    if reward not in ALL_REWARDS:
        raise BadInput(f"gmm1d has no reward {reward!r}; it has {', '.join(ALL_REWARDS)}")
    return reward


def reward_value(reward: str, x0: np.ndarray) -> np.ndarray:
    """The binary reward r(x_0) ∈ {0, 1} (METHOD.md §4): coarse 1{x > 0}, mid 1{|x| > 2}, fine odd 0.2-cells."""
    x0 = np.asarray(x0, dtype=np.float64)
    if check_reward(reward) == "coarse":
        return (x0 > 0).astype(np.float64)
    if reward == "mid":
        return (np.abs(x0) > 2).astype(np.float64)
    return (np.floor(x0 / CELL[reward]) % 2 == 1).astype(np.float64)


def posterior(x: np.ndarray, sigma: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The closed-form posterior x_0 | x_σ = x, a Gaussian mixture, for σ ∈ [0, 1] (elementwise).

    With v_σ = (1 − σ)²·s² + σ²: component j has weight ∝ ¼·N(x; (1 − σ)μ_j, v_σ), mean
    ``μ_j + (1 − σ)s²/v_σ·(x − (1 − σ)μ_j)`` and std ``s·σ/√v_σ``. Returns
    ``(log_marginal [N], weights [N, J], means [N, J], std [N])``; ``log_marginal`` is the
    log-density of x_σ under π^old_σ. Weights are normalised in the log domain.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), x.shape)
    keep = (1 - sigma)[:, None]
    var_t = ((1 - sigma) ** 2 * STD**2 + sigma**2)[:, None]
    centred = x[:, None] - keep * MEANS[None, :]
    log_dens = np.log(1.0 / len(MEANS)) - 0.5 * centred**2 / var_t - 0.5 * np.log(2 * np.pi * var_t)
    log_marginal = logsumexp(log_dens, axis=1)
    weights = np.exp(log_dens - log_marginal[:, None])
    means = MEANS[None, :] + keep * STD**2 / var_t * centred
    return log_marginal, weights, means, (STD * sigma / np.sqrt(var_t[:, 0]))


def posterior_cdf(x0: np.ndarray, x: float, sigma: float) -> np.ndarray:
    """P(x_0 ≤ x0 | x_σ = x): the closed-form posterior CDF (for tests against samples)."""
    _, weights, means, std = posterior(np.array([x]), sigma)
    z = (np.asarray(x0, dtype=np.float64)[..., None] - means[0]) / std[0]
    return (weights[0] * ndtr(z)).sum(-1)


def old_cdf(x0: np.ndarray) -> np.ndarray:
    """CDF of π^old = ¼ Σ_j N(μ_j, s²)."""
    return ndtr((np.asarray(x0, dtype=np.float64)[..., None] - MEANS) / STD).mean(-1)


def positive_cdf(reward: str, x0: np.ndarray, beta: float = BETA) -> np.ndarray:
    """CDF of π⁺ ∝ π^old·exp(r/β) (E2) by quadrature on a fine grid (the tilt is piecewise constant)."""
    grid = np.linspace(MEANS.min() - 10 * STD, MEANS.max() + 10 * STD, 200_001)
    dens = np.exp(-0.5 * ((grid[:, None] - MEANS) / STD) ** 2).sum(-1) * np.exp(reward_value(reward, grid) / beta)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    return np.interp(np.asarray(x0, dtype=np.float64), grid, cdf / cdf[-1])


def sample_old(n: int, seed: int) -> np.ndarray:
    """n exact samples of π^old (float64), deterministic from ``seed``."""
    rng = np.random.default_rng(seed)
    return MEANS[rng.integers(0, len(MEANS), size=n)] + STD * rng.standard_normal(n)


def sample_positive(reward: str, n: int, seed: int, beta: float = BETA) -> np.ndarray:
    """n exact samples of π⁺ ∝ π^old·exp(r/β) (E2): rejection from π^old.

    A draw x is accepted with probability exp(r(x)/β)/exp(1/β) ≤ 1 (r ≤ 1 bounds the tilt),
    which is exact for any β > 0.
    """
    check_reward(reward)
    if beta <= 0:
        raise BadInput(f"beta must be > 0, got {beta}")
    rng = np.random.default_rng(seed)
    kept: list[np.ndarray] = []
    total = 0
    while total < n:
        x = MEANS[rng.integers(0, len(MEANS), size=2 * n)] + STD * rng.standard_normal(2 * n)
        accept = rng.uniform(size=x.shape) < np.exp((reward_value(reward, x) - 1.0) / beta)
        kept.append(x[accept])
        total += int(accept.sum())
    return np.concatenate(kept)[:n]


def exact_discriminability(reward: str, sigma: float, alpha: float, beta: float = BETA,
                           quad_step: float = 5e-4) -> float:
    """D_α(π⁺_σ ‖ π^old_σ) (E4) for one reward at noise level σ, by quadrature over x_σ.

    h(x) = E[exp(r/β) | x_σ = x] = 1 + (e^{1/β} − 1)·P(r = 1 | x_σ = x) (E3), Z = E[exp(r/β)],
    D_α = 1/(α−1)·log E_{π^old_σ}[(h/Z)^α], and for α = 1 the KL E[(h/Z)·log(h/Z)].
    Any α > 0 and β > 0.
    """
    if not alpha > 0 or not beta > 0:
        raise BadInput(f"gmm1d needs alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}")
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
        log_marginal, post_w, post_mean, post_std = posterior(x, sigma)
        p_pos = (post_w * reward_probability(reward, post_mean, post_std[:, None])).sum(axis=1)
        ratio = (1.0 + lift * p_pos) / z
        prob = np.exp(log_marginal) * quad_step
    if alpha == 1.0:
        return float(np.sum(prob * ratio * np.log(ratio)))
    return float(np.log(np.sum(prob * ratio**alpha)) / (alpha - 1.0))


def exact_gain_table(rewards: tuple[str, ...] = REWARDS, alpha: float = 2.0, steps: int = 25,
                     beta: float = BETA, advance=None) -> GainTable:
    """The exact ``recast.gains/1`` table of the gmm1d world (E4, E5) on σ_t = t/T.

    ``advance`` (optional) is called once per (reward, level) computed: a progress bar's hook.
    """
    sigmas = GridSpec("linear").sigmas(steps)

    def one(reward: str, sigma: float) -> float:
        value = exact_discriminability(reward, sigma, alpha, beta)
        if advance is not None:
            advance()
        return value

    D = np.array([[one(r, s) for s in sigmas] for r in rewards])
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


@dataclass(frozen=True)
class GMM1DConditioning:
    """The gmm1d world is unconditional: the conditioning only carries the prompts, row by row."""

    prompts: tuple[str, ...]

    def take(self, index: torch.Tensor) -> GMM1DConditioning:
        return GMM1DConditioning(tuple(self.prompts[i] for i in index.tolist()))


class GMM1DPolicy(FlowPolicy):
    """The analytic world as a policy: exact velocity, exact posterior rollouts (METHOD.md §4).

    ``sigmas`` is the linear grid σ_t = t/T; a latent is one number (``latent_shape == (1,)``),
    float64 on the CPU. "Images" are the samples x_0 themselves: ``decode`` and ``encode``
    return their input unchanged ([B, 1]) and the rewards are functions of x_0
    (:func:`reward_value`). With ``exact_rollouts`` (default) :meth:`rollout` draws x_0 from
    the exact posterior x_0 | x_t, which is what the estimator's rollouts are meant to sample
    (E3); with ``exact_rollouts=False`` it runs the shared SDE sampler of the base class on
    the exact velocity instead, to measure a kernel's proxy against the exact answer.
    """

    def __init__(self, steps: int = 25, exact_rollouts: bool = True):
        if not isinstance(steps, int) or steps < 1:
            raise BadInput(f"steps must be a positive integer, got {steps!r}")
        self.sigmas = torch.from_numpy(GridSpec("linear").sigmas(steps))
        self.exact_rollouts = exact_rollouts

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (1,)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64

    def encode_prompts(self, prompts: Sequence[str]) -> GMM1DConditioning:
        return GMM1DConditioning(tuple(prompts))

    def posterior_mean(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """E[x_0 | x_σ = x] for x [B, 1] and per-sample σ [B]."""
        _, weights, means, _ = posterior(x.detach().cpu().numpy()[:, 0], sigma.detach().cpu().numpy())
        return torch.from_numpy((weights * means).sum(1)).to(x.dtype).view(-1, 1)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: GMM1DConditioning) -> torch.Tensor:
        """The exact velocity v = E[ε − x_0 | x_σ] = (x − E[x_0 | x_σ])/σ (and −x at σ = 0, where ε ⟂ x_0)."""
        x0_hat = self.posterior_mean(x, sigma)
        s = sigma.to(x.dtype).view(-1, 1)
        return torch.where(s > 0, (x - x0_hat) / torch.where(s > 0, s, 1.0), -x)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The sample itself: in the 1-D world there is no image space beyond x_0."""
        return latents.clone()

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """The sample itself (the inverse of :meth:`decode`)."""
        return images.clone()

    @torch.no_grad()
    def rollout(self, x: torch.Tensor, t: torch.Tensor, cond: GMM1DConditioning, noise_level: float,
                seeds: torch.Tensor) -> torch.Tensor:
        """x_0 drawn from the exact posterior x_0 | x_t for each sample, each at its own t (E3).

        The draw uses ``step_noise(seed, 1)``: the noise of the last step, the one every rollout
        shares whatever its start, so the same seed at different t gives coupled draws (common
        random numbers, METHOD.md §4) and the same (seed, t) always the same x_0. One uniform
        picks the component by inverse CDF over the posterior weights, one normal the offset.
        ``noise_level`` is only checked: the exact posterior is the exact time reversal's answer.
        """
        if noise_level < 0:
            raise BadInput(f"noise level a must be >= 0, got {noise_level}")
        t = t.to(torch.long).cpu()
        if not self.exact_rollouts:
            return super().rollout(x, t, cond, noise_level, seeds)
        self._check_steps(t)
        z = step_noise(seeds, torch.ones_like(t), (2,), torch.float64, torch.device("cpu")).numpy()
        _, weights, means, std = posterior(x.detach().cpu().numpy()[:, 0], self.sigmas[t].numpy())
        u = ndtr(z[:, 0])
        component = np.minimum((np.cumsum(weights, axis=1) < u[:, None]).sum(1), len(MEANS) - 1)
        x0 = means[np.arange(len(u)), component] + std * z[:, 1]
        return torch.from_numpy(x0).to(x.dtype).view(-1, 1)


class GMM1DReward(Scorer):
    """A gmm1d reward as a scorer: the "images" of the 1-D world are the samples x_0 ([B, 1])."""

    output_range = (0.0, 1.0)

    def __init__(self, name: str):
        self.name = check_reward(name)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> np.ndarray:
        values = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
        if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
            raise BadInput(f"reward {self.name!r} scores 1-D samples x_0 ([B] or [B, 1]), got shape {list(values.shape)}")
        return reward_value(self.name, values.astype(np.float64).reshape(-1))


class Coarse(GMM1DReward):
    """``coarse`` = 1{x_0 > 0}: which pair of modes (registry name ``coarse``)."""

    def __init__(self):
        super().__init__("coarse")


class Mid(GMM1DReward):
    """``mid`` = 1{|x_0| > 2}: the outer mode of each pair (registry name ``mid``)."""

    def __init__(self):
        super().__init__("mid")


class Fine(GMM1DReward):
    """``fine`` = 1{x_0 in an odd 0.2-cell}: detail inside a mode (registry name ``fine``)."""

    def __init__(self):
        super().__init__("fine")


class FineWide(GMM1DReward):
    """``fine_wide`` = 1{x_0 in an odd 0.3-cell}: the control partner of ``fine`` (same peak step)."""

    def __init__(self):
        super().__init__("fine_wide")


if __name__ == "__main__":
    write_gains(sys.argv[1], exact_gain_table(), config={"world": "gmm1d", "exact": True})

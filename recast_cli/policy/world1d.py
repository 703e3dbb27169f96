"""The 1-D analytic world as data: a Gaussian mixture π^old and step-function rewards on the line.

A :class:`World1D` is everything the analytic worlds ``gmm1d`` and ``flow1d`` know in closed form
(docs/method.md §4): π^old = Σ_j w_j·N(μ_j, s_j²), rectified-flow noising x_σ = (1 − σ)x_0 + σε, and
rewards r(x_0) that are constant on cells of the line (:class:`~recast_cli.policy.step_reward.StepReward`).
From these follow, exactly: the posterior x_0 | x_σ (a Gaussian mixture), the rectified-flow
velocity, P(r = v) under any Gaussian (a sum of ndtr differences over cells), π^old and
π⁺ ∝ π^old·exp(r/β) samples and CDFs, and D_α(π⁺_σ ‖ π^old_σ) (E3, E4) by a 1-D quadrature. What
every 1-D world shares is written once, here: its σ grid (:data:`GRID`, ``World1D.grid``) and the β
of its π⁺ (:data:`BETA`, ``World1D.beta``).

:data:`DEFAULT_WORLD` is the world of docs/method.md §4 (¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4);
``coarse``, ``mid``, ``fine``, ``fine_wide``); a setting's ``[world]`` table defines another
(:mod:`~recast_cli.policy.world_table`, docs/settings.md "[world]"). Every world is checked as it is
built, against the limits of :mod:`~recast_cli.policy.world_limits`. Numbers are float64 throughout;
the world's entry points take arrays of any shape (``velocity``, ``velocity_torch``, ``posterior``,
``reward_value`` — numpy, or torch for ``velocity_torch`` and ``reward_value``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.special import logsumexp, ndtr, ndtri

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.step_reward import REACH, StepReward
from recast_cli.policy.world_limits import POSTERIOR_COST, QUAD_STEP, check_tilt, check_world, held_levels

#: β of the analytic worlds: π⁺ ∝ π^old·exp(r/β) with the raw reward (docs/method.md §4).
BETA = 0.5
#: The σ grid of every 1-D world (docs/method.md §4): linear in σ.
GRID = GridSpec("linear")
#: Quadrature points × components the exact estimate holds at once: its float64 arrays [points, J] are
#: computed in chunks of this many elements, so its memory is bounded whatever the world.
QUAD_CHUNK = 1 << 20
#: π⁺ is drawn by rejection from π^old while it accepts at least this share of draws; below, by the exact
#: inverse CDF of the tilted cells (a rare, high-value cell would otherwise take ~1/acceptance draws each).
MIN_ACCEPTANCE = 1e-3
#: The exact π⁺ sampler enumerates cells out to where a Gaussian's tail, tilted by the reward's whole
#: spread, weighs less than e^{-TAIL_LOG} (about 1e-20) of π⁺.
TAIL_LOG = 46.0


@dataclass(frozen=True)
class World1D:
    """π^old = Σ_j w_j·N(μ_j, s_j²) and named step-function rewards (see the module docstring).

    ``rewards`` is a tuple of (name, :class:`StepReward`) in definition order. ``label`` names the
    world in messages (``gmm1d``, or a setting's ``[world]``) and is no part of its identity: two
    worlds with equal mixtures and rewards are equal. Construction checks the definition
    (:func:`~recast_cli.policy.world_limits.check_world`: BadInput, one line, starting ``[world]``).
    A method that takes β defaults to the world's (``beta``).
    """

    weights: tuple[float, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]
    rewards: tuple[tuple[str, StepReward], ...]
    label: str = field(default="gmm1d", compare=False)
    #: what every 1-D world shares: its σ grid and the β of its π⁺ (the one place each is written)
    grid: ClassVar[GridSpec] = GRID
    beta: ClassVar[float] = BETA

    def __post_init__(self) -> None:
        check_world(self)

    # ------------------------------------------------------------------ the mixture

    @property
    def w(self) -> np.ndarray:
        return np.asarray(self.weights, dtype=np.float64)

    @property
    def mu(self) -> np.ndarray:
        return np.asarray(self.means, dtype=np.float64)

    @property
    def s(self) -> np.ndarray:
        return np.asarray(self.stds, dtype=np.float64)

    def support(self, reach: float = REACH) -> tuple[float, float]:
        """[min_j μ_j − reach·s_j, max_j μ_j + reach·s_j]."""
        return float((self.mu - reach * self.s).min()), float((self.mu + reach * self.s).max())

    def components(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n component indices drawn by weight (equal weights: ``rng.integers``, as gmm1d always drew)."""
        J = len(self.weights)
        if len(set(self.weights)) == 1:
            return rng.integers(0, J, size=n)
        return np.minimum(np.searchsorted(np.cumsum(self.w), rng.random(n), side="right"), J - 1)

    def sample_old(self, n: int, seed: int) -> np.ndarray:
        """n exact samples of π^old (float64), deterministic from ``seed``."""
        rng = np.random.default_rng(seed)
        j = self.components(rng, n)
        return self.mu[j] + self.s[j] * rng.standard_normal(n)

    def old_cdf(self, x0: np.ndarray) -> np.ndarray:
        """The CDF of π^old, elementwise."""
        z = (np.asarray(x0, dtype=np.float64)[..., None] - self.mu) / self.s
        return (self.w * ndtr(z)).sum(-1)

    # ------------------------------------------------------------------ the noised world

    def posterior(self, x: np.ndarray, sigma: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                               np.ndarray]:
        """The closed-form posterior x_0 | x_σ = x, a Gaussian mixture, for σ ∈ [0, 1] (elementwise).

        With v_j = (1 − σ)²·s_j² + σ²: component j has weight ∝ w_j·N(x; (1 − σ)μ_j, v_j), mean
        ``μ_j + (1 − σ)s_j²/v_j·(x − (1 − σ)μ_j)`` and std ``s_j·σ/√v_j``. For x of shape S (σ
        broadcast to it) returns ``(log_marginal [S], weights [S, J], means [S, J], stds [S, J])``;
        ``log_marginal`` is the log-density of x_σ under π^old_σ. Weights are normalised in the
        log domain.
        """
        x = np.asarray(x, dtype=np.float64)
        sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), x.shape)[..., None]
        keep = 1 - sigma
        s2 = self.s**2
        var_t = (1 - sigma) ** 2 * s2 + sigma**2
        centred = x[..., None] - keep * self.mu
        log_dens = np.log(self.w) - 0.5 * centred**2 / var_t - 0.5 * np.log(2 * np.pi * var_t)
        log_marginal = logsumexp(log_dens, axis=-1)
        weights = np.exp(log_dens - log_marginal[..., None])
        means = self.mu + keep * s2 / var_t * centred
        return log_marginal, weights, means, self.s * sigma / np.sqrt(var_t)

    def posterior_mean(self, x: np.ndarray, sigma: np.ndarray | float) -> np.ndarray:
        """E[x_0 | x_σ = x], any shape."""
        _, weights, means, _ = self.posterior(x, sigma)
        return (weights * means).sum(-1)

    def posterior_cdf(self, x0: np.ndarray, x: float, sigma: float) -> np.ndarray:
        """P(x_0 ≤ x0 | x_σ = x): the closed-form posterior CDF (for tests against samples)."""
        _, weights, means, std = self.posterior(np.array([x]), sigma)
        z = (np.asarray(x0, dtype=np.float64)[..., None] - means[0]) / std[0]
        return (weights[0] * ndtr(z)).sum(-1)

    def velocity(self, x: np.ndarray, sigma: np.ndarray | float) -> np.ndarray:
        """The exact rectified-flow velocity E[ε − x_0 | x_σ = x] = (x − E[x_0 | x_σ])/σ, and −x at
        σ = 0 (where ε ⟂ x_0); numpy float64, any shape (σ broadcast to x)."""
        x = np.asarray(x, dtype=np.float64)
        sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), x.shape)
        x0_hat = self.posterior_mean(x, sigma)
        return np.where(sigma > 0, (x - x0_hat) / np.where(sigma > 0, sigma, 1.0), -x)

    def velocity_torch(self, x, sigma):
        """:meth:`velocity` in torch on x's device and dtype: x of any shape, σ a tensor or number
        broadcastable to it. No gradient flows (the exact velocity does not depend on θ). Agrees
        with the numpy :meth:`velocity` to rounding (float64).

        One level for the whole batch (a number, or a tensor of one element: sampling and
        evaluation, where every sample is at the same step) takes a faster path: the components'
        constants are computed once in float64, and the posterior is one pass of in-place ops over
        x's [..., J] array (the batched study engine spends a sixth of its time here)."""
        import torch

        with torch.no_grad():
            if not torch.is_tensor(sigma) or sigma.numel() == 1:
                return self._velocity_one_level(x, float(sigma))
            sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).expand_as(x)
            mu = torch.tensor(self.means, dtype=x.dtype, device=x.device)
            s2 = torch.tensor(self.stds, dtype=x.dtype, device=x.device) ** 2
            log_w = torch.log(torch.tensor(self.weights, dtype=x.dtype, device=x.device))
            sig = sigma.unsqueeze(-1)
            keep = 1 - sig
            var_t = keep**2 * s2 + sig**2
            centred = x.unsqueeze(-1) - keep * mu
            log_dens = log_w - 0.5 * centred**2 / var_t - 0.5 * torch.log(2 * math.pi * var_t)
            weights = torch.softmax(log_dens, dim=-1)
            x0_hat = (weights * (mu + keep * s2 / var_t * centred)).sum(-1)
            positive = sigma > 0
            return torch.where(positive, (x - x0_hat) / torch.where(positive, sigma, torch.ones_like(sigma)), -x)

    def _velocity_one_level(self, x, sigma: float):
        """:meth:`velocity_torch` at one level σ for every element of x (no gradient)."""
        import torch

        if sigma == 0.0:
            return -x
        keep = 1.0 - sigma
        s2 = self.s**2
        var_t = keep**2 * s2 + sigma**2
        # log w_j N(x; keep·μ_j, v_j) = a_j − b_j·(x − keep·μ_j)²; posterior mean μ_j + g_j·(x − keep·μ_j)
        a, b, g, shift, mu = (torch.tensor(c, dtype=x.dtype, device=x.device) for c in
                              (np.log(self.w) - 0.5 * np.log(2 * np.pi * var_t), 0.5 / var_t,
                               keep * s2 / var_t, keep * self.mu, self.mu))
        centred = x.unsqueeze(-1) - shift
        post = centred.square().mul_(b).neg_().add_(a)
        post = post.sub_(post.amax(dim=-1, keepdim=True)).exp_()  # the softmax's numerator, max-shifted
        x0_hat = (centred.mul_(g).add_(mu).mul_(post)).sum(-1).div_(post.sum(-1))
        return (x - x0_hat).div_(sigma)

    # ------------------------------------------------------------------ the rewards

    @property
    def reward_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.rewards)

    def reward(self, name: str) -> StepReward:
        """The reward ``name``; BadInput naming the world's rewards if it has none of that name."""
        for known, reward in self.rewards:
            if known == name:
                return reward
        raise BadInput(f"{self.label} has no reward {name!r}; it has {', '.join(self.reward_names)}")

    def check_reward(self, name: str) -> str:
        self.reward(name)
        return name

    def reward_value(self, name: str, x0):
        """r(x_0) for a numpy array (float64) or a torch tensor (float64 on its device), any shape."""
        reward = self.reward(name)
        if type(x0).__module__.startswith("torch"):
            return reward.value_torch(x0)
        return reward.value(x0)

    def reward_levels(self, name: str) -> tuple[float, ...]:
        """The distinct values of reward ``name``, ascending."""
        return self.reward(name).levels

    def reward_range(self, name: str) -> tuple[float, float]:
        levels = self.reward_levels(name)
        return levels[0], levels[-1]

    def reward_probability(self, name: str, mean: np.ndarray, std: np.ndarray,
                           level: float | None = None) -> np.ndarray:
        """P(r = level) under N(mean, std²), elementwise (``level`` defaults to the reward's highest
        value: P(r = 1) for a 0/1 reward); std = 0 gives the indicator at ``mean``."""
        reward = self.reward(name)
        return reward.probability(mean, std, reward.levels[-1] if level is None else level)

    def cell_table(self, reward: StepReward, reach: float = REACH) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                              np.ndarray]:
        """The cells of ``reward`` over :meth:`support` (``reach``) as arrays: starts [C], ends [C],
        values [C] and each component's mass of each cell [C, J], accurate in both tails (the smaller
        of the two ndtr differences)."""
        cells = list(reward.cells(*self.support(reach)))
        a, b, values = (np.array(column, dtype=np.float64) for column in zip(*cells))
        za, zb = (a[:, None] - self.mu) / self.s, (b[:, None] - self.mu) / self.s
        mass = np.minimum(ndtr(zb) - ndtr(za), ndtr(-za) - ndtr(-zb))
        return a, b, values, mass

    def cell_masses(self, reward: StepReward) -> list[tuple[float, float]]:
        """(π^old mass, value) of each cell of ``reward`` over the support."""
        _, _, values, mass = self.cell_table(reward)
        return list(zip((mass @ self.w).tolist(), values.tolist()))

    def positive_acceptance(self, name: str, beta: float = BETA) -> float:
        """The share of π^old draws the rejection sampler of π⁺ accepts: E_{π^old}[exp((r − r_max)/β)],
        from the cells' exact masses (before any draw)."""
        reward = self.reward(name)
        _, _, values, mass = self.cell_table(reward)
        return float((mass @ self.w) @ np.exp((values - reward.levels[-1]) / beta))

    # ------------------------------------------------------------------ π⁺ and the exact curves

    def positive_cdf(self, name: str, x0: np.ndarray, beta: float = BETA) -> np.ndarray:
        """CDF of π⁺ ∝ π^old·exp(r/β) (E2) by quadrature on a fine grid (the tilt is piecewise constant;
        taken relative to the reward's top value, so it never overflows)."""
        lo, hi = self.support(10)
        grid = np.linspace(lo, hi, 200_001)
        bumps = self.w / self.s * np.exp(-0.5 * ((grid[:, None] - self.mu) / self.s) ** 2)
        dens = bumps.sum(-1) * np.exp((self.reward_value(name, grid) - self.reward_range(name)[1]) / beta)
        cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
        return np.interp(np.asarray(x0, dtype=np.float64), grid, cdf / cdf[-1])

    def sample_positive(self, name: str, n: int, seed: int, beta: float = BETA) -> np.ndarray:
        """n exact samples of π⁺ ∝ π^old·exp(r/β) (E2), deterministic from ``seed``.

        Rejection from π^old: a draw x is accepted with probability exp((r(x) − r_max)/β) ≤ 1, exact
        for any β > 0. Where that accepts fewer than ``MIN_ACCEPTANCE`` of the draws (a rare cell of
        high value: the loop would take ~n/acceptance draws), the exact inverse CDF of the tilted
        cells instead (:meth:`_sample_positive_cells`), as exact and as fast for any world.
        """
        top = self.reward_range(name)[1]
        if not beta > 0:
            raise BadInput(f"beta must be > 0, got {beta}")
        check_tilt(f"[world.rewards.{name}]", self.reward(name), beta)
        rng = np.random.default_rng(seed)
        if self.positive_acceptance(name, beta) < MIN_ACCEPTANCE:
            return self._sample_positive_cells(self.reward(name), n, rng, beta)
        kept: list[np.ndarray] = []
        total = 0
        while total < n:
            j = self.components(rng, 2 * n)
            x = self.mu[j] + self.s[j] * rng.standard_normal(2 * n)
            accept = rng.uniform(size=x.shape) < np.exp((self.reward_value(name, x) - top) / beta)
            kept.append(x[accept])
            total += int(accept.sum())
        return np.concatenate(kept)[:n]

    def _sample_positive_cells(self, reward: StepReward, n: int, rng: np.random.Generator,
                               beta: float) -> np.ndarray:
        """n exact π⁺ draws by inverse CDF: π⁺ = Σ_{cell c, component j} w_j·m_{cj}·e^{v_c/β}/Z ·
        N(μ_j, s_j²) restricted to c, so pick (c, j) by that weight, then a truncated normal in c.

        The cells are enumerated out to where even the reward's whole tilt leaves less than
        e^{-TAIL_LOG} of π⁺; each draw takes its uniform on the side of its cell's smaller tail (the
        survival function right of the mean), so a cell 10 stds out is sampled to full precision.
        """
        reach = max(REACH, math.sqrt(2 * ((reward.levels[-1] - reward.levels[0]) / beta + TAIL_LOG)))
        a, b, values, mass = self.cell_table(reward, reach)
        with np.errstate(divide="ignore"):  # a cell without mass (log 0 = −inf) is never picked
            log_weight = np.log(np.maximum(mass, 0.0) * self.w) + ((values - reward.levels[-1]) / beta)[:, None]
        weight = np.exp(log_weight - log_weight.max()).ravel()
        c, j = np.divmod(rng.choice(weight.size, size=n, p=weight / weight.sum()), len(self.means))
        za, zb = (a[c] - self.mu[j]) / self.s[j], (b[c] - self.mu[j]) / self.s[j]
        u = (rng.integers(0, 2**52, size=n) + 0.5) / 2**52  # strictly inside (0, 1)
        z = np.where(za > 0, -ndtri(ndtr(-zb) + u * (ndtr(-za) - ndtr(-zb))),
                     ndtri(ndtr(za) + u * (ndtr(zb) - ndtr(za))))
        # beyond ±reach stds lies less than e^{-TAIL_LOG} of π⁺; rounding never leaves the cell
        x = self.mu[j] + self.s[j] * np.clip(z, -reach, reach)
        return np.clip(x, a[c], np.nextafter(b[c], -np.inf))

    def quadrature_span(self, sigmas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi] of the exact estimate's quadrature over x_σ at each σ of ``sigmas``: every
        component's (1 − σ)μ_j ± REACH·√((1 − σ)²s_j² + σ²)."""
        sigma = np.asarray(sigmas, dtype=np.float64)[:, None]
        sd = np.sqrt((1 - sigma) ** 2 * self.s**2 + sigma**2)
        return ((1 - sigma) * self.mu - REACH * sd).min(axis=1), ((1 - sigma) * self.mu + REACH * sd).max(axis=1)

    def exact_work(self, name: str, sigmas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the exact D of reward ``name`` costs at each σ of ``sigmas``, known before any array is
        built: (quadrature points [S], cells enumerated [S], work [S] = points × components × (cells +
        levels + POSTERIOR_COST)); σ = 0 needs no quadrature (work 0).

        The cells are those P(r = u | x_σ) sums over: the explicit cells, or the periodic cells over
        the posterior means' range ± REACH posterior stds (each posterior mean is linear and
        increasing in x, so its range is that of the grid's ends, the last within QUAD_STEP past hi).
        The levels are those above the lowest that these cells can hold (:func:`held_levels`): each is
        one more sum over the components at every point; a level without a cell there costs nothing.
        """
        reward = self.reward(name)
        sigma = np.asarray(sigmas, dtype=np.float64)
        lo, hi = self.quadrature_span(sigma)
        points = np.floor((hi - lo) / QUAD_STEP) + 2
        keep, s2 = 1 - sigma[:, None], self.s**2
        var_t = keep**2 * s2 + sigma[:, None] ** 2
        gain = keep * s2 / var_t
        reach = REACH * (self.s * sigma[:, None] / np.sqrt(var_t)).max(axis=1)
        first = (self.mu + gain * (lo[:, None] - keep * self.mu)).min(axis=1) - reach
        last = (self.mu + gain * (hi[:, None] + QUAD_STEP - keep * self.mu)).max(axis=1) + reach
        cells = np.array([reward.count_cells(a, b) for a, b in zip(first.tolist(), last.tolist())])
        work = np.where(sigma > 0, points * len(self.means) * (cells + held_levels(reward, cells) + POSTERIOR_COST),
                        0.0)
        return points, cells, work

    def exact_discriminability(self, name: str, sigma: float, alpha: float, beta: float = BETA,
                               quad_step: float = QUAD_STEP) -> float:
        """D_α(π⁺_σ ‖ π^old_σ) (E4) for one reward at noise level σ, by quadrature over x_σ.

        With levels u_0 < u_1 < … of the reward, h(x) ∝ E[exp(r/β) | x_σ = x] = e^{u_0/β}·(1 +
        Σ_{k≥1} (e^{(u_k − u_0)/β} − 1)·P(r = u_k | x_σ = x)) (E3; the factor cancels in h/Z),
        Z = E[exp(r/β)], D_α = 1/(α−1)·log E_{π^old_σ}[(h/Z)^α] (summed in the log domain, so a
        large α cannot overflow), and for α = 1 the KL E[(h/Z)·log(h/Z)]. Any α > 0 and β > 0 with
        (u_max − u_0)/β ≤ MAX_TILT (``check_tilt``). The quadrature runs in chunks of QUAD_CHUNK points ×
        components: its memory is bounded; its time is what ``exact_work`` says.
        """
        if not alpha > 0 or not beta > 0:
            raise BadInput(f"{self.label} needs alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}")
        reward = self.reward(name)
        levels = reward.levels
        lifts = [np.expm1((u - levels[0]) / beta) for u in levels[1:]]
        p_data = [0.0] * len(lifts)
        for k, p in reward.held_probabilities(self.mu, self.s, levels[1:]):
            p_data[k] = float(self.w @ p)
        z = 1.0 + sum(lift * p for lift, p in zip(lifts, p_data))
        if sigma == 0.0:
            ratio = np.array([np.exp((u - levels[0]) / beta) for u in levels[1:]] + [1.0]) / z
            parts = [_renyi_part(ratio, np.array(p_data + [1.0 - sum(p_data)]), alpha)]
        else:
            lo, hi = (float(end[0]) for end in self.quadrature_span(np.array([sigma])))
            x = np.arange(lo, hi + quad_step, quad_step)
            chunk = max(1, QUAD_CHUNK // len(self.means))
            parts = []
            for start in range(0, len(x), chunk):
                log_marginal, post_w, post_mean, post_std = self.posterior(x[start:start + chunk], sigma)
                # only the levels with a cell near this chunk's posteriors: the others add exactly 0
                h = 1.0 + sum((lifts[k] * (post_w * p).sum(axis=1)
                               for k, p in reward.held_probabilities(post_mean, post_std, levels[1:])),
                              np.zeros(log_marginal.shape))
                parts.append(_renyi_part(h / z, np.exp(log_marginal) * quad_step, alpha))
        if alpha == 1.0:
            return float(sum(parts))
        return float(logsumexp(parts) / (alpha - 1.0))

    def describe(self) -> dict[str, Any]:
        """The definition as JSON: the mixture and each reward's cells."""
        return {"weights": list(self.weights), "means": list(self.means), "stds": list(self.stds),
                "rewards": {name: reward.describe() for name, reward in self.rewards}}


def _renyi_part(ratio: np.ndarray, prob: np.ndarray, alpha: float) -> float:
    """One chunk's share of D_α's expectation over π^old_σ: Σ prob·ratio·log ratio (α = 1, summed),
    else log Σ prob·ratio^α (combined by log-sum-exp: ratio^α itself may exceed float64)."""
    if alpha == 1.0:
        return float(np.sum(prob * ratio * np.log(ratio)))
    return float(logsumexp(alpha * np.log(ratio), b=prob))



#: docs/method.md §4's world: π^old = ¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4), and its rewards.
DEFAULT_WORLD = World1D(
    weights=(0.25, 0.25, 0.25, 0.25),
    means=(-2.4, -1.6, 1.6, 2.4),
    stds=(0.25, 0.25, 0.25, 0.25),
    rewards=(
        ("coarse", StepReward(edges=(0.0,), values=(0.0, 1.0))),  # 1{x > 0}: which pair of modes
        ("mid", StepReward(edges=(-2.0, 2.0), values=(1.0, 0.0, 1.0))),  # 1{|x| > 2}: the outer mode of a pair
        ("fine", StepReward(cell=0.2, values=(0.0, 1.0))),  # odd 0.2-cells: detail inside a mode
        ("fine_wide", StepReward(cell=0.3, values=(0.0, 1.0))),  # odd 0.3-cells: fine's control partner
    ),
)

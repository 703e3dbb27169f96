"""The 1-D analytic world as data: a Gaussian mixture π^old and step-function rewards on the line.

A :class:`World1D` is everything the analytic worlds ``gmm1d`` and ``flow1d`` know in closed form
(METHOD.md §4): π^old = Σ_j w_j·N(μ_j, s_j²), rectified-flow noising x_σ = (1 − σ)x_0 + σε, and
rewards r(x_0) that are constant on cells of the line (:class:`StepReward`). From these follow,
exactly: the posterior x_0 | x_σ (a Gaussian mixture), the rectified-flow velocity, P(r = v)
under any Gaussian (a sum of ndtr differences over cells), π^old and π⁺ ∝ π^old·exp(r/β) samples
and CDFs, and D_α(π⁺_σ ‖ π^old_σ) (E3, E4) by a 1-D quadrature.

:data:`DEFAULT_WORLD` is the world of METHOD.md §4 (¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4);
``coarse``, ``mid``, ``fine``, ``fine_wide``); a setting's ``[world]`` table defines another
(:func:`world_from_table`, docs/settings.md "[world]"). Numbers are float64 throughout; the
world's entry points take arrays of any shape (``velocity``, ``velocity_torch``, ``posterior``,
``reward_value`` — numpy, or torch for ``velocity_torch`` and ``reward_value``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.special import logsumexp, ndtr, ndtri

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec

#: The most cells a reward may have: its explicit cells, or its periodic cells over the support.
MAX_CELLS = 10_000
#: The most mixture components a world may have (the posterior holds N × J numbers).
MAX_COMPONENTS = 100
#: |Σ w_j − 1| allowed.
WEIGHT_TOLERANCE = 1e-9
#: A cell has appreciable mass when π^old gives it at least this probability.
MASS_FLOOR = 1e-12
#: The support of a Gaussian, in standard deviations either side of its mean (cells are enumerated over it).
REACH = 12

# The work limits (docs/settings.md "[world]", "Work limits"): every world is bounded by the work it
# implies, checked when it is defined, before any array is built.

#: The largest |number| a world may place on the line (a mean, an edge, an interval end, a phase) and the
#: largest std or cell width: (x − μ)², μ ± REACH·s and (e − μ)/s then stay far inside float64.
MAX_COORDINATE = 1e6
#: The smallest std: (e − μ)/s stays finite for every edge e and mean μ within ±MAX_COORDINATE.
MIN_STD = 1e-6
#: β of the analytic worlds: π⁺ ∝ π^old·exp(r/β) with the raw reward (METHOD.md §4).
BETA = 0.5
#: The σ grid of every 1-D world (METHOD.md §4): linear in σ.
GRID = GridSpec("linear")
#: The largest tilt (r_max − r_min)/β of a reward: every exp of a reward over β is taken relative to one of
#: its values (rejection's exp((r − r_max)/β), the π⁺ CDF's and cell sampler's, the exact D's
#: expm1((u − u_0)/β)), so it stays within e^{±700} ≈ 1e±304, inside float64 (largest about e^709.8) with
#: room for a factor of 10⁴ (the KL's ratio·log ratio, at most e^700·700).
MAX_TILT = 700.0
#: The largest |r| of a reward value, like MAX_COORDINATE for places: r/β and its α-multiples (the sampled
#: estimate's log-weights, ``estimate.gains.MAX_LOG_WEIGHT``), the trainer's advantages and means stay far
#: inside float64.
MAX_VALUE = 1e6
#: The exact estimate's quadrature step over x_σ (E4).
QUAD_STEP = 5e-4
#: Quadrature points × components the exact estimate holds at once: its float64 arrays [points, J] are
#: computed in chunks of this many elements, so its memory is bounded whatever the world.
QUAD_CHUNK = 1 << 20
#: The cost of the posterior at one quadrature point and component, in units of one cell's Gaussian mass
#: there (measured: a two-cell reward costs as much per point as about ten cells' masses).
POSTERIOR_COST = 8
#: The most work the exact D of one reward may take at one noise level: quadrature points × components ×
#: (cells enumerated + levels they hold + POSTERIOR_COST), a few seconds on one CPU core (a level's sum
#: costs about as much as a cell's mass).
MAX_LEVEL_WORK = 1e8
#: The most work one exact gain table may take: the sum over its rewards, noise levels and α (minutes).
MAX_EXACT_WORK = 2e10
#: π⁺ is drawn by rejection from π^old while it accepts at least this share of draws; below, by the exact
#: inverse CDF of the tilted cells (a rare, high-value cell would otherwise take ~1/acceptance draws each).
MIN_ACCEPTANCE = 1e-3
#: The exact π⁺ sampler enumerates cells out to where a Gaussian's tail, tilted by the reward's whole
#: spread, weighs less than e^{-TAIL_LOG} (about 1e-20) of π⁺.
TAIL_LOG = 46.0


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


@dataclass(frozen=True)
class World1D:
    """π^old = Σ_j w_j·N(μ_j, s_j²) and named step-function rewards (see the module docstring).

    ``rewards`` is a tuple of (name, :class:`StepReward`) in definition order. ``label`` names the
    world in messages (``gmm1d``, or a setting's ``[world]``) and is no part of its identity: two
    worlds with equal mixtures and rewards are equal. Construction checks the definition
    (BadInput, one line, starting ``[world]``).
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

    def positive_cdf(self, name: str, x0: np.ndarray, beta: float) -> np.ndarray:
        """CDF of π⁺ ∝ π^old·exp(r/β) (E2) by quadrature on a fine grid (the tilt is piecewise constant;
        taken relative to the reward's top value, so it never overflows)."""
        lo, hi = self.support(10)
        grid = np.linspace(lo, hi, 200_001)
        bumps = self.w / self.s * np.exp(-0.5 * ((grid[:, None] - self.mu) / self.s) ** 2)
        dens = bumps.sum(-1) * np.exp((self.reward_value(name, grid) - self.reward_range(name)[1]) / beta)
        cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
        return np.interp(np.asarray(x0, dtype=np.float64), grid, cdf / cdf[-1])

    def sample_positive(self, name: str, n: int, seed: int, beta: float) -> np.ndarray:
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

    def exact_discriminability(self, name: str, sigma: float, alpha: float, beta: float,
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


# ---------------------------------------------------------------------- checks


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_world(world: World1D) -> None:
    """BadInput (one line, ``[world] …``) unless ``world`` is a world the exact code can use."""
    J = len(world.means)
    if not 1 <= J <= MAX_COMPONENTS:
        raise BadInput(f"[world] means must hold 1 to {MAX_COMPONENTS} components, got {J}")
    if len(world.weights) != J or len(world.stds) != J:
        raise BadInput(f"[world] weights, means and stds must have one entry per component: "
                       f"{len(world.weights)}, {J} and {len(world.stds)} given")
    for key in ("weights", "means", "stds"):
        bad = [v for v in getattr(world, key) if not _finite(v)]
        if bad:
            raise BadInput(f"[world] {key} must be finite numbers, got {bad[0]!r}")
    if min(world.stds) <= 0:
        raise BadInput(f"[world] stds must be > 0, got {min(world.stds)!r}")
    _check_within("[world] means", world.means)
    bad = [v for v in world.stds if not MIN_STD <= v <= MAX_COORDINATE]
    if bad:
        raise BadInput(f"[world] stds must be from {MIN_STD:g} to {MAX_COORDINATE:g}, got {bad[0]!r}")
    if min(world.weights) <= 0:
        raise BadInput(f"[world] weights must be > 0, got {min(world.weights)!r}")
    if abs(math.fsum(world.weights) - 1) > WEIGHT_TOLERANCE:
        raise BadInput(f"[world] weights sum to {math.fsum(world.weights)!r}, not 1 (within {WEIGHT_TOLERANCE:g})")
    if not world.rewards:
        raise BadInput("[world] defines no reward: add [world.rewards.NAME] tables")
    names = [name for name, _ in world.rewards]
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise BadInput(f"[world] reward {twice[0]!r} is defined twice")
    lo, hi = world.support()
    for name, reward in world.rewards:
        check_reward(name, reward, lo, hi)
        masses = world.cell_masses(reward)
        seen = {value for mass, value in masses if mass >= MASS_FLOOR}
        if len(seen) < 2:
            only = next(iter(seen), reward.values[0])
            raise BadInput(f"[world.rewards.{name}] is constant on the support: every cell π^old gives mass >= "
                           f"{MASS_FLOOR:g} holds {only!r} (a constant reward tilts nothing)")
        check_level_work(world, name)


#: The noise levels the per-level work of a world is checked at, 0.01 apart over (0, 1]: the work varies
#: smoothly in σ, and each exact table checks its own grid σ_t = t/T in full (``check_exact_work``).
WORK_SIGMAS = np.linspace(0.0, 1.0, 101)[1:]


def held_levels(reward: StepReward, cells: np.ndarray) -> np.ndarray:
    """How many levels above the lowest ``cells`` enumerated cells of ``reward`` can hold: all of them for
    explicit cells, at most one per cell for a periodic pattern (of 10⁴ values, a few near the means)."""
    return np.minimum(cells, len(reward.levels) - 1)


def check_level_work(world: World1D, name: str) -> None:
    """BadInput unless the exact D of reward ``name`` takes at most MAX_LEVEL_WORK at every noise level
    (:meth:`World1D.exact_work`): a world whose quadrature grid or cell enumeration is too large is
    refused when it is defined, naming the number that is too large."""
    points, cells, work = world.exact_work(name, WORK_SIGMAS)
    i = int(np.argmax(work))
    if work[i] > MAX_LEVEL_WORK:
        lo, hi = (float(end[0]) for end in world.quadrature_span(WORK_SIGMAS[i:i + 1]))
        levels = held_levels(world.reward(name), cells[i])
        raise BadInput(f"[world.rewards.{name}]: its exact estimate needs {points[i]:.3g} quadrature points "
                       f"(x_σ in [{lo:.4g}, {hi:.4g}] by {QUAD_STEP:g}) × {len(world.means)} components × "
                       f"({cells[i]:.3g} cells + {levels:.3g} levels + {POSTERIOR_COST}) = {work[i]:.3g} "
                       f"evaluations at σ = {WORK_SIGMAS[i]:.2f}; at most {MAX_LEVEL_WORK:g} per noise level are "
                       "allowed (bring the means closer, or use fewer components, cells or distinct values)")


def check_exact_work(world: World1D, rewards, sigmas: np.ndarray, alphas: int) -> None:
    """BadInput unless one exact gain table — ``rewards`` on the grid ``sigmas``, for ``alphas``
    orders α — takes at most MAX_EXACT_WORK in all (checked before any quadrature)."""
    total = alphas * sum(float(world.exact_work(name, sigmas)[2].sum()) for name in rewards)
    if total > MAX_EXACT_WORK:
        raise BadInput(f"the exact estimate of {world.label} needs {total:.3g} evaluations for {len(rewards)} "
                       f"reward(s) × {len(sigmas)} noise levels × {alphas} α; at most {MAX_EXACT_WORK:g} are "
                       "allowed: use fewer --steps, rewards or α")


def check_tilt(where: str, reward: StepReward, beta: float, fix: str = "scale the reward down") -> None:
    """BadInput unless ``reward``'s values span at most MAX_TILT·β: every exp of a value over β is taken
    relative to another value, so only the spread (r_max − r_min)/β can overflow — (200, 201) tilts as
    (0, 1) does. Names the real cause before any exp overflows (``fix``: what to do); Python floats, so
    an absurd spread warns of nothing."""
    low, high = min(reward.values), max(reward.values)
    tilt = (high - low) / beta
    if not tilt <= MAX_TILT:
        raise BadInput(f"{where} values span {low:g} to {high:g}, too wide for β = {beta:g}: the tilt "
                       f"exp((r − r_min)/β) reaches e^{tilt:.4g} and overflows float64; keep (r_max − r_min)/β "
                       f"<= {MAX_TILT:g} (a spread <= {MAX_TILT * beta:g}): {fix}")


def _check_within(where: str, values, limit: float = MAX_COORDINATE) -> None:
    """BadInput unless every number of ``values`` lies within ±``limit`` (a place on the line by default)."""
    bad = [v for v in values if abs(v) > limit]
    if bad:
        raise BadInput(f"{where} must lie within ±{limit:g}, got {bad[0]!r}")


def check_reward(name: str, reward: StepReward, lo: float, hi: float) -> None:
    where = f"[world.rewards.{name}]"
    if reward.cell is None:
        if len(reward.values) != len(reward.edges) + 1:
            raise BadInput(f"{where} needs one value per cell, len(edges) + 1 = {len(reward.edges) + 1}; "
                           f"got {len(reward.values)} values")
        bad = [e for e in reward.edges if not _finite(e)]
        if bad:
            raise BadInput(f"{where} edges must be finite numbers, got {bad[0]!r}")
        _check_within(f"{where} edges", reward.edges)
        if any(b <= a for a, b in zip(reward.edges, reward.edges[1:])):
            raise BadInput(f"{where} edges must be strictly increasing (sorted, no repeats), got "
                           f"{_short(reward.edges)}")
    else:
        if not (_finite(reward.cell) and reward.cell > 0) or not _finite(reward.phase):
            raise BadInput(f"{where} needs cell > 0 and a finite phase, got cell = {reward.cell!r}, "
                           f"phase = {reward.phase!r}")
        if not reward.values:
            raise BadInput(f"{where} needs a pattern: the values of consecutive cells, repeated")
        _check_within(f"{where} cell and phase", (reward.cell, reward.phase))
    bad = [v for v in reward.values if not _finite(v)]
    if bad:
        raise BadInput(f"{where} values must be finite numbers, got {bad[0]!r}")
    check_tilt(where, reward, BETA)
    _check_within(f"{where} values", reward.values, MAX_VALUE)
    cells = reward.count_cells(lo, hi)
    if cells > MAX_CELLS:
        shown = "more than 10^300" if not math.isfinite(cells) else f"{int(cells)}"
        raise BadInput(f"{where} has {shown} cells over the support [{lo:g}, {hi:g}] (π^old's means ± {REACH} "
                       f"stds); at most {MAX_CELLS} are allowed")


def _short(items) -> str:
    text = "[" + ", ".join(f"{x:g}" for x in items[:8]) + (", …]" if len(items) > 8 else "]")
    return text


#: METHOD.md §4's world: π^old = ¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4), and its rewards.
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

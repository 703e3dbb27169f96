"""The analytic world ``gmm1d``: exact Rényi discriminability curves for testing the method.

docs/method.md §4, "The analytic world": π^old = ¼ Σ_j N(μ_j, 0.25²), μ = (−2.4, −1.6, 1.6, 2.4),
rectified-flow noising x_σ = (1 − σ)x_0 + σε on the linear grid σ_t = t/T, binary rewards
used raw with β = 0.5. The posterior x_0 | x_σ is a Gaussian mixture in closed form, so the
density ratio h_{i,t} (E3) and D_α (E4) are exact up to a 1-D quadrature.

:class:`GMM1DPolicy` is the same world behind the policy protocol: its velocity is the exact
rectified-flow velocity and its rollouts draw the exact posterior x_0 | x_t, so the estimator
(E6–E8) can be run on it and compared with the exact curves. Exact π^old and π⁺ samples
(E2: by rejection, or by the tilted cells' inverse CDF where rejection accepts too few draws) and the
three rewards as functions of x_0 complete the world.

The world itself — mixture, rewards, grid and β — is data: :mod:`recast_cli.policy.world1d`'s
:class:`~recast_cli.policy.world1d.World1D`, whose methods compute its exact answers (π^old and π⁺
samples and CDFs, the posterior, D_α); ``DEFAULT_WORLD`` is the world above. :class:`GMM1DPolicy`,
:class:`GMM1DReward` and :func:`exact_gain_table` take any world, e.g. a setting's ``[world]`` table
(docs/settings.md).

Run ``python -m recast_cli.policy.gmm1d OUT.parquet`` to write the exact ``recast.gains/2``
table (coarse, mid, fine; α = 2; T = 25) shipped as the example in ``pipelines/examples/``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import ndtr

from recast_cli.artifacts import GainTable, write_gains
from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.base import FlowPolicy, step_noise
from recast_cli.policy.world1d import DEFAULT_WORLD, World1D
from recast_cli.rewards.base import Scorer

MEANS = np.array(DEFAULT_WORLD.means)
STD = 0.25
REWARDS = ("coarse", "mid", "fine")


def world_meta(world: World1D) -> dict:
    """The ``policy`` entry of an exact table's metadata: the mixture of the default world as it
    always was recorded, any other world's whole definition."""
    if world == DEFAULT_WORLD:
        return {"name": "gmm1d", "means": MEANS.tolist(), "std": STD}
    return {"name": "gmm1d", "world": world.describe()}


def exact_gain_table(rewards: tuple[str, ...] = REWARDS, alpha: float = 2.0, steps: int = 25,
                     beta: float | None = None, advance=None, world: World1D = DEFAULT_WORLD) -> GainTable:
    """The exact ``recast.gains/2`` table of an analytic world (E4, E5) on its grid σ_t = t/T (default:
    gmm1d's), with the world's β unless ``beta`` is given.

    ``advance`` (optional) is called once per (reward, level) computed: a progress bar's hook.
    """
    beta = world.beta if beta is None else beta
    sigmas = world.grid.sigmas(steps)

    def one(reward: str, sigma: float) -> float:
        value = world.exact_discriminability(reward, sigma, alpha, beta)
        if advance is not None:
            advance()
        return value

    D = np.array([[one(r, s) for s in sigmas] for r in rewards])
    gain_raw = D[:, :-1] - D[:, 1:]
    # D_α is non-increasing in σ (E5); where a reward's D is flat (a step that decides nothing of it)
    # the quadrature's round-off can leave a gain of -1e-13: that is 0, anything larger a real error
    tiny = 1e-9 * max(float(np.abs(D).max()), 1.0)
    gain = np.where((gain_raw < 0) & (gain_raw > -tiny), 0.0, gain_raw)
    return GainTable(
        rewards=tuple(rewards),
        sigmas=sigmas,
        D=D,
        gain_raw=gain_raw,
        gain=gain,
        meta={
            "alpha": alpha, "beta": beta, "N": None, "K": None, "P": None,
            "sampling": "exact", "crn": None, "monotone": "none",
            "reward_std": {r: 1.0 for r in rewards},
            "policy": world_meta(world),
            "positives": {"source": "exact"},
            "grid": world.grid.to_json(),
        },
    )


@dataclass(frozen=True)
class GMM1DConditioning:
    """The gmm1d world is unconditional: the conditioning only carries the prompts, row by row."""

    prompts: tuple[str, ...]

    def take(self, index: torch.Tensor) -> GMM1DConditioning:
        return GMM1DConditioning(tuple(self.prompts[i] for i in index.tolist()))


class GMM1DPolicy(FlowPolicy):
    """The analytic world as a policy: exact velocity, exact posterior rollouts (docs/method.md §4).

    ``sigmas`` is the world's grid σ_t = t/T (``grid_spec``); a latent is one number (``latent_shape ==
    (1,)``), float64 on the CPU. "Images" are the samples x_0 themselves: ``decode`` and ``encode``
    return their input unchanged ([B, 1]) and the rewards are functions of x_0
    (:meth:`World1D.reward_value`). With ``exact_rollouts`` (default) :meth:`rollout` draws x_0 from
    the exact posterior x_0 | x_t, which is what the estimator's rollouts are meant to sample
    (E3); with ``exact_rollouts=False`` it runs the shared SDE sampler of the base class on
    the exact velocity instead, to measure a kernel's proxy against the exact answer. ``world``
    is the mixture and rewards (:class:`~recast_cli.policy.world1d.World1D`; default: docs/method.md §4's).
    """

    def __init__(self, steps: int = 25, exact_rollouts: bool = True, world: World1D = DEFAULT_WORLD):
        if not isinstance(steps, int) or steps < 1:
            raise BadInput(f"steps must be a positive integer, got {steps!r}")
        self.sigmas = torch.from_numpy(world.grid.sigmas(steps))
        self.exact_rollouts = exact_rollouts
        self.world = world

    @property
    def grid_spec(self) -> GridSpec:
        """The σ grid, the world's own (an image policy's is its scheduler's)."""
        return self.world.grid

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
        _, weights, means, _ = self.world.posterior(x.detach().cpu().numpy()[:, 0], sigma.detach().cpu().numpy())
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
        random numbers, docs/method.md §4) and the same (seed, t) always the same x_0. One uniform
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
        _, weights, means, std = self.world.posterior(x.detach().cpu().numpy()[:, 0], self.sigmas[t].numpy())
        u = ndtr(z[:, 0])
        component = np.minimum((np.cumsum(weights, axis=1) < u[:, None]).sum(1), weights.shape[1] - 1)
        rows = np.arange(len(u))
        x0 = means[rows, component] + std[rows, component] * z[:, 1]
        return torch.from_numpy(x0).to(x.dtype).view(-1, 1)


class GMM1DReward(Scorer):
    """A reward of an analytic world as a scorer: the "images" of the 1-D world are the samples x_0
    ([B, 1]); ``world`` defaults to gmm1d's."""

    output_range = (0.0, 1.0)

    def __init__(self, name: str, world: World1D = DEFAULT_WORLD):
        self.world = world
        self.name = world.check_reward(name)
        self.output_range = world.reward_range(name)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> np.ndarray:
        values = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
        if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
            raise BadInput(f"reward {self.name!r} scores 1-D samples x_0 ([B] or [B, 1]), got shape {list(values.shape)}")
        return self.world.reward_value(self.name, values.astype(np.float64).reshape(-1))


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

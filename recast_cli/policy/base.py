"""The policy protocol: what the estimator and the trainer may ask of a model.

A policy is a flow-matching model plus its sampler on a fixed grid of T steps, in the
paper's convention: ``sigmas[t]`` is σ_t for t = 0..T (σ_0 = 0, σ_T the noisiest) and step
t moves x_t (at σ_t) to x_{t-1}. Concrete policies implement prompt encoding, the velocity
(one batched model call, each sample at its own σ) and the latent/image maps; the step,
the mixed-t rollouts and trajectory sampling are shared here, so every policy samples the
same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.policy.sde import sde_step
from recast_cli.seeds import hashed_normal, step_noise_seed


class Conditioning(Protocol):
    """Encoded prompts, one row per sample; ``take`` selects rows (for active subsets)."""

    def take(self, index: torch.Tensor) -> Conditioning: ...


@dataclass(frozen=True)
class StepOutput:
    x_next: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor | None


@dataclass(frozen=True)
class Trajectory:
    """States x_T … x_0 (``states[:, j]`` is x_{T−j}) and the log-probability of each step."""

    states: torch.Tensor
    log_probs: torch.Tensor | None
    sigmas: torch.Tensor


#: latents up to this many elements draw their noise from a vectorised counter-based hash
HASHED_NOISE_MAX = 4096
def step_noise(seeds: torch.Tensor, step: torch.Tensor, shape: Sequence[int], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """Standard normal noise for (sample seed, step t): the same pair always gives the same draw.

    This is how common random numbers work across start steps (docs/method.md §4): rollout k of
    positive n uses seed (n, k), and its step-t noise does not depend on where it started or
    on the batch it runs in. Small latents (≤ HASHED_NOISE_MAX elements, e.g. the 1-D world)
    use a vectorised counter-based hash; image latents use one seeded torch generator per sample.
    """
    size = int(np.prod(shape)) if len(shape) else 1
    if size <= HASHED_NOISE_MAX:
        values = hashed_normal(seeds.cpu().numpy(), step.cpu().numpy(), size)
        return torch.from_numpy(values).view(len(seeds), *shape).to(device=device, dtype=dtype)
    out = torch.empty((len(seeds), *shape), dtype=torch.float32)
    for i, (seed, t) in enumerate(zip(seeds.tolist(), step.tolist())):
        gen = torch.Generator().manual_seed(step_noise_seed(seed, t))
        out[i] = torch.randn(tuple(shape), generator=gen)
    return out.to(device=device, dtype=dtype)


class FlowPolicy(ABC):
    """A rectified-flow model with its sampler on a grid of T steps.

    A trainable policy also has ``network`` (the ``torch.nn.Module`` the trainer updates, by
    LoRA or in full) and ``denoiser`` (the module ``velocity`` calls: ``network`` itself, or
    the trainer's DDP- or compile-wrapped copy of it); the trainer reaches no further in.
    """

    #: σ_t for t = 0..T, float64 on the CPU (paper order).
    sigmas: torch.Tensor

    @property
    def T(self) -> int:
        return len(self.sigmas) - 1

    @property
    @abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """Shape of one latent x (without the batch dimension)."""

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @abstractmethod
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for each prompt (cached per prompt by implementations that encode text)."""

    @abstractmethod
    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """v(x, σ) for a batch, each sample at its own σ ([B]); one model call (CFG included)."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → images [B, 3, H, W] in [0, 1]."""

    @abstractmethod
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] → latents (deterministic: the posterior mean)."""

    # ------------------------------------------------------------------ shared sampler

    def forward_noise(self, x0: torch.Tensor, sigma: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """x_σ = (1 − σ)·x_0 + σ·ε, per-sample σ [B]."""
        s = sigma.to(x0.dtype).view((-1,) + (1,) * (x0.dim() - 1))
        return (1 - s) * x0 + s * eps

    def _check_steps(self, t: torch.Tensor) -> None:
        if t.numel() and (int(t.min()) < 1 or int(t.max()) > self.T):
            raise BadInput(f"step t must lie in 1..{self.T}, got {int(t.min())}..{int(t.max())}")

    def step(self, x: torch.Tensor, t: torch.Tensor, cond: Conditioning, noise_level: float,
             noise: torch.Tensor | None = None, prev_sample: torch.Tensor | None = None) -> StepOutput:
        """Step t → t−1 for every sample (E1), each sample at its own t ([B] int)."""
        if noise_level < 0:
            raise BadInput(f"noise level a must be >= 0, got {noise_level}")
        self._check_steps(t)
        sigma = self.sigmas[t].to(self.device)
        sigma_next = self.sigmas[t - 1].to(self.device)
        v = self.velocity(x, sigma, cond)
        x_next, mean, std, log_prob = sde_step(x, v, sigma, sigma_next, noise_level, noise, prev_sample)
        return StepOutput(x_next, mean, std, log_prob)

    @torch.no_grad()
    def rollout(self, x: torch.Tensor, t: torch.Tensor, cond: Conditioning, noise_level: float,
                seeds: torch.Tensor) -> torch.Tensor:
        """Run each sample from its own x_t down to x_0: mixed t in one batch.

        Every iteration makes one model call over all samples that still have steps left,
        each at its own σ. Sample i's noise at step s comes from ``step_noise(seeds[i], s)``,
        so the endpoint does not depend on which other samples share the batch.
        """
        if noise_level < 0:
            raise BadInput(f"noise level a must be >= 0, got {noise_level}")
        t = t.to(torch.long).cpu()
        self._check_steps(t)
        x = x.clone()
        current = t.clone()
        while bool((current > 0).any()):
            active = torch.nonzero(current > 0).view(-1)
            steps = current[active]
            noise = None
            if noise_level > 0:
                noise = step_noise(seeds[active], steps, self.latent_shape, x.dtype, x.device)
            out = self.step(x[active.to(x.device)], steps, cond.take(active), noise_level, noise=noise)
            x[active.to(x.device)] = out.x_next
            current[active] -= 1
        return x

    @torch.no_grad()
    def sample(self, cond: Conditioning, noise_level: float, seeds: torch.Tensor,
               keep_log_probs: bool = True) -> Trajectory:
        """Trajectories from pure noise (x_T ~ N(0, I) from ``seeds``) to x_0, keeping every state."""
        n = len(seeds)
        x = step_noise(seeds, torch.full((n,), self.T + 1), self.latent_shape, self.dtype, self.device)
        states = [x]
        log_probs = []
        for t in range(self.T, 0, -1):
            steps = torch.full((n,), t, dtype=torch.long)
            noise = step_noise(seeds, steps, self.latent_shape, x.dtype, x.device) if noise_level > 0 else None
            out = self.step(x, steps, cond, noise_level, noise=noise)
            x = out.x_next
            states.append(x)
            log_probs.append(out.log_prob)
        lp = torch.stack(log_probs, dim=1) if keep_log_probs and noise_level > 0 else None
        return Trajectory(states=torch.stack(states, dim=1), log_probs=lp, sigmas=self.sigmas)

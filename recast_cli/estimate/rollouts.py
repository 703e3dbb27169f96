"""The expensive half of ``recast estimate``: rollouts from noised samples and their reward scores.

For each prompt (docs/method.md §4, E6): take N samples x_0^n — positives under π⁺-sampling,
the endpoints of the policy's own trajectories under π^old-sampling (E8) — form x_t^n for
t = 1..T, run K rollouts from every x_t^n down to x_0, and score every reward on every
endpoint. All (n, t, k) rollouts of a prompt run as mixed-t batches (one model call per
iteration over every sample that still has steps left, each at its own σ).

Noise (common random numbers, on by default): sample n draws one ε^n for every t, and
rollout (n, k) uses one seed for every start step, so its step-s noise is the same whatever
t it started from. With ``crn=False`` both are drawn afresh per t.

A prompt's scores depend only on (seed, prompt id), never on which other prompts, shards or
processes ran: that is what makes shards merge exactly and a resumed run identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from recast_cli.policy.base import FlowPolicy, step_noise
from recast_cli.rewards.base import Scorer
from recast_cli.seeds import EPS_ROLLOUT, NO_STEP, TRAJECTORY_ROLLOUT, TRAJECTORY_SET, rollout_seeds

@dataclass(frozen=True)
class RolloutPlan:
    """What to run for one prompt: T, K, the rollout kernel and the noise scheme."""

    K: int
    rollout_noise: float
    crn: bool = True
    seed: int = 0
    batch_size: int = 64


def score_endpoints(policy: FlowPolicy, latents: torch.Tensor, prompt: str, scorers: Sequence[Scorer]) -> np.ndarray:
    """Decode latents once and score every reward: [B, m]."""
    images = policy.decode(latents)
    prompts = [prompt] * len(latents)
    return np.stack([s.score(images, prompts) for s in scorers], axis=1)


def _jobs(N: int, T: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, t, k) of every job, n-major then t then k: consecutive jobs of a sample span every t."""
    n, t, k = np.meshgrid(np.arange(N), np.arange(1, T + 1), np.arange(K), indexing="ij")
    return n.ravel(), t.ravel(), k.ravel()


def noised_starts(policy: FlowPolicy, x0: torch.Tensor, plan: RolloutPlan, prompt_id: int, reward_set: int,
                   ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (n, t, k) job of π⁺-sampling (E6): x_t^n = (1 − σ_t)·x_0^n + σ_t·ε^n, its step and seed."""
    N, T = len(x0), policy.T
    n, t, k = _jobs(N, T, plan.K)
    step_slot = np.full_like(t, NO_STEP) if plan.crn else t
    first = k == 0  # one ε per (n, t) job group; with CRN the same ε^n for every t
    eps_seeds = rollout_seeds(plan.seed, prompt_id, reward_set, n[first], EPS_ROLLOUT, step_slot[first])
    eps = step_noise(torch.from_numpy(eps_seeds), torch.zeros(len(eps_seeds), dtype=torch.long),
                     policy.latent_shape, x0.dtype, x0.device)
    sigma = policy.sigmas[torch.from_numpy(t[first])].to(x0.device)
    x_t = policy.forward_noise(x0[torch.from_numpy(n[first]).to(x0.device)], sigma, eps)
    starts = x_t.repeat_interleave(plan.K, dim=0)
    seeds = rollout_seeds(plan.seed, prompt_id, reward_set, n, k, step_slot)
    return starts, t, seeds, n, k


def _trajectory_starts(policy: FlowPolicy, states: torch.Tensor, plan: RolloutPlan, prompt_id: int,
                       ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (n, t, k) job of π^old-sampling (E8): x_t^n from the policy's own trajectory n."""
    N, T = states.shape[0], policy.T
    n, t, k = _jobs(N, T, plan.K)
    step_slot = np.full_like(t, NO_STEP) if plan.crn else t
    starts = states[torch.from_numpy(n).to(states.device), torch.from_numpy(T - t).to(states.device)]
    return starts, t, rollout_seeds(plan.seed, prompt_id, TRAJECTORY_SET, n, k, step_slot), n, k


def prompt_scores(policy: FlowPolicy, prompt: str, prompt_id: int, scorers: Sequence[Scorer], plan: RolloutPlan,
                  sampling: str, positives: Sequence[torch.Tensor] | None = None, N: int | None = None,
                  on_rollouts: Callable[[int], None] | None = None) -> np.ndarray:
    """Scores [N, T+1, K, m] of one prompt.

    ``positives``: latents [N, …] per positive set — one shared set (every reward) or one per
    reward (set i serves reward i only). π^old-sampling takes ``N`` trajectories instead.
    ``on_rollouts(count)`` is called after every batch (progress).
    """
    T, K, m = policy.T, plan.K, len(scorers)
    if sampling == "pplus":
        if positives is None:
            raise ValueError("π⁺-sampling needs positives")
        sets = list(positives)
        N = len(sets[0])
    else:
        sets = [None]
    out = np.full((N, T + 1, K, m), np.nan)
    cond_cache = policy.encode_prompts([prompt])
    for set_index, x0 in enumerate(sets):
        rewards = range(m) if len(sets) == 1 else [set_index]
        if sampling == "pplus":
            start, step, seeds, n_job, k_job = noised_starts(policy, x0.to(policy.device), plan, prompt_id,
                                                              set_index)
            endpoint0 = x0.to(policy.device)
        else:
            traj_seeds = rollout_seeds(plan.seed, prompt_id, TRAJECTORY_SET, np.arange(N), TRAJECTORY_ROLLOUT,
                                       NO_STEP)
            cond = cond_cache.take(torch.zeros(N, dtype=torch.long))
            states = policy.sample(cond, plan.rollout_noise, torch.from_numpy(traj_seeds), keep_log_probs=False).states
            start, step, seeds, n_job, k_job = _trajectory_starts(policy, states, plan, prompt_id)
            endpoint0 = states[:, -1]
        scores0 = score_endpoints(policy, endpoint0, prompt, [scorers[i] for i in rewards])
        out[:, 0, 0, list(rewards)] = scores0
        # mixed-t batches: consecutive jobs of one sample span every t
        for begin in range(0, len(start), plan.batch_size):
            sl = slice(begin, begin + plan.batch_size)
            cond = cond_cache.take(torch.zeros(len(step[sl]), dtype=torch.long))
            ends = policy.rollout(start[sl], torch.from_numpy(step[sl]), cond, plan.rollout_noise,
                                  torch.from_numpy(seeds[sl]))
            values = score_endpoints(policy, ends, prompt, [scorers[i] for i in rewards])
            for j, i in enumerate(rewards):
                out[n_job[sl], step[sl], k_job[sl], i] = values[:, j]
            if on_rollouts is not None:
                on_rollouts(len(ends))
    return out

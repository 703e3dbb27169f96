"""The training objective of METHOD.md §6: group advantages, E13, the PPO-clipped loss and the KL.

Pure tensor functions, shared by the trainer and its tests: static and ReCAST runs differ
only in the W handed to ``step_advantages``.
"""

from __future__ import annotations

import torch

ADV_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group_size: int, global_std: bool = False) -> torch.Tensor:
    """Per-reward group advantages ``A_i = (r_i − mean_group r_i) / (std r_i + 1e-4)`` (METHOD.md §6).

    ``rewards`` [B, m] with B = groups × G, each group's G samples contiguous. The std is the
    group's (population std), or with ``global_std`` the std over all B samples (Flow-GRPO's
    default). Returns [B, m] in float64.
    """
    r = rewards.to(torch.float64)
    B, m = r.shape
    if B % group_size:
        raise ValueError(f"{B} samples do not split into groups of {group_size}")
    groups = r.view(B // group_size, group_size, m)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if global_std:
        std = r.std(dim=0, unbiased=False).view(1, 1, m)
    else:
        std = groups.std(dim=1, unbiased=False, keepdim=True)
    return (centred / (std + ADV_EPS)).view(B, m)


def step_advantages(adv: torch.Tensor, W: torch.Tensor, clip: float | None = None,
                    trained: int | None = None) -> torch.Tensor:
    """E13: ``A_t = T'·Σ_i W_{i,t}·A_i`` for every sample and step, then clipped to ±clip.

    ``adv`` [B, m]; ``W`` [m, T] with column t−1 the weights of step t (paper order), zero on
    the steps the trainer does not train; ``trained`` = T', the number of trained steps
    (default: all T). Returns [B, T] (column t−1 is step t). A static W (``W_{i,t} = λ̂_i/T'``
    on the trained steps) gives ``Σ_i λ̂_i·A_i`` at every trained step.
    """
    W = W.to(adv.dtype)
    out = adv @ (W * (W.shape[1] if trained is None else trained))
    return out if clip is None else out.clamp(-clip, clip)


def ppo_terms(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor,
              clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO-clipped policy loss per (sample, step) and whether the clip was active.

    ``loss = max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε))`` with ``ρ = exp(logp_θ − logp_old)``.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantage * ratio
    clipped = -advantage * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped), (torch.abs(ratio - 1.0) > clip_range)


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, dt: torch.Tensor,
                form: str = "exact") -> torch.Tensor:
    """KL(p_θ ‖ p_ref) of two Gaussian transitions with the same std, per sample [B].

    ``exact``: ``‖μ_θ − μ_ref‖² / (2·std²)`` with ``std = s·sqrt(−dt)`` the transition's std,
    averaged over the latent's elements (the log-probabilities are averaged the same way).
    ``flowgrpo``: Flow-GRPO's form, which divides by ``2·s²`` and so omits the −dt factor.
    """
    sq = ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.dim())))
    var = std.view(-1) ** 2
    if form == "flowgrpo":
        var = var / (-dt.view(-1).to(var.dtype))
    elif form != "exact":
        raise ValueError(f"unknown KL form {form!r}")
    return sq / (2 * var)

"""The training objective of docs/method.md §6: group advantages, E13, the PPO-clipped loss and the KL.

Pure tensor functions, shared by both trainers (``train.trainer``, one run; ``train.stacked``, a
stack of seeds) and their tests: the per-pair loss is :func:`pair_loss`, written once. Static and
ReCAST runs differ only in the W handed to ``step_advantages``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

ADV_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group_size: int, global_std: bool = False) -> torch.Tensor:
    """Per-reward group advantages ``A_i = (r_i − mean_group r_i) / (std r_i + 1e-4)`` (docs/method.md §6).

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


class PairLoss(NamedTuple):
    """The loss of (image, trained step) pairs and the parts the trainers log, each of the
    log-probabilities' shape: the PPO term, the KL, whether the clip was active (0/1, float), and
    their total ``policy_loss + β_KL·kl``."""

    policy_loss: torch.Tensor
    kl: torch.Tensor
    clipped: torch.Tensor
    loss: torch.Tensor


def pair_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor, *,
              clip_range: float, beta_kl: float = 0.0, mean: torch.Tensor | None = None,
              ref_mean: torch.Tensor | None = None, std: torch.Tensor | None = None,
              dt: torch.Tensor | None = None, kl_form: str = "exact") -> PairLoss:
    """The per-step loss of docs/method.md §6 for every (image, step) pair: the PPO-clipped ratio times A_t
    (:func:`ppo_terms`), plus ``β_KL·KL(p_θ ‖ p_ref)`` (:func:`gaussian_kl`) when β_KL > 0.

    ``log_prob``, ``old_log_prob`` and ``advantage`` have one element per pair, any leading shape
    (one run: [n]; the batched engine: [S, n]). The KL's inputs — the transition's mean under θ and
    under the reference, its std and dt = σ_{t−1} − σ_t — are read only when β_KL > 0 (the caller
    runs the reference then, and only then); its per-sample KL takes the pairs' shape. Both
    trainers call this, so they train the same loss, float op for float op.
    """
    policy_loss, clipped = ppo_terms(log_prob, old_log_prob, advantage, clip_range)
    if beta_kl > 0:
        kl = gaussian_kl(mean, ref_mean, std, dt, kl_form).view_as(policy_loss)
        return PairLoss(policy_loss, kl, clipped.float(), policy_loss + beta_kl * kl)
    return PairLoss(policy_loss, torch.zeros_like(policy_loss), clipped.float(), policy_loss)

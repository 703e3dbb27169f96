"""E1: one step of the Flow-GRPO SDE sampler (a = 0: the Euler ODE step)."""

from __future__ import annotations

import math

import torch


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    noise_level: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    with_log_prob: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """E1 of docs/method.md: the Gaussian transition x_σ → x_σ' of the flow SDE with noise level a.

    ``μ = x + v·dt + (s²/(2σ))·(x + (1 − σ)·v)·dt``, ``s = a·sqrt(σ/(1 − σ))``,
    ``dt = σ' − σ < 0``, ``x' = μ + s·sqrt(−dt)·z``. At σ = 1 the denominator 1 − σ uses σ'
    (Flow-GRPO uses the grid's σ_1, the same number on the first step).

    Shapes: ``x, v`` [B, …]; ``sigma, sigma_next`` [B] (per-sample levels, mixed-t batches);
    ``noise`` [B, …] standard normal, drawn when None; ``prev_sample`` given: evaluate its
    log-probability instead of sampling. Returns ``(x_next, mean, std, log_prob)`` with
    ``std`` [B] and ``log_prob`` [B] the Gaussian log-density averaged over the non-batch
    dimensions (Flow-GRPO's convention). With ``noise_level = 0`` the step is Euler,
    ``std = 0`` and ``log_prob`` is None; ``with_log_prob=False`` skips it too (sampling only).
    """
    shape = (-1,) + (1,) * (x.dim() - 1)
    sigma64 = sigma.to(torch.float64)
    next64 = sigma_next.to(torch.float64)
    dt = (next64 - sigma64).view(shape).to(x.dtype)
    sig = sigma.view(shape).to(x.dtype)
    if noise_level == 0:
        mean = x + v * dt
        x_next = mean if prev_sample is None else prev_sample
        return x_next, mean, torch.zeros_like(sigma, dtype=x.dtype), None
    denom = 1 - torch.where(sigma64 >= 1, next64, sigma64)
    s = (noise_level * torch.sqrt(sigma64 / denom)).view(shape).to(x.dtype)
    mean = x + v * dt + (s**2 / (2 * sig)) * (x + (1 - sig) * v) * dt
    std = s * torch.sqrt(-dt)
    if prev_sample is None:
        if noise is None:
            noise = torch.randn_like(x)
        x_next = mean + std * noise
    else:
        x_next = prev_sample
    if not with_log_prob:
        return x_next, mean, std.view(-1), None
    log_prob = (
        -((x_next.detach() - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    )
    return x_next, mean, std.view(-1), log_prob.mean(dim=tuple(range(1, x.dim())))

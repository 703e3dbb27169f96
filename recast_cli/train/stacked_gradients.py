"""Each reward's share of the policy gradient, and its signal-to-noise, in a cell of the batched engine.

A mechanism beside a study's endpoints (issue 42): does per-reward timing give each reward a
cleaner gradient? At the parameters the batch was sampled from, the PPO ratio is 1 and E13 is
linear in the per-reward advantages (before the ±adv_clip clip), so the first update's gradient
is the sum over rewards of

    g_i = −(1/P) Σ_pairs T'·W_{i,t}·A_i(image) · ∇_θ log p_θ(x_{t−1} | x_t)

over the P (image, trained step) pairs. Each seed's batch is cut in two halves of whole groups
(the first half of its prompts, and the second), giving two independent estimates g_i^A and g_i^B
of the same expectation μ_i. Then, per seed,

    signal_i = g_i^A · g_i^B             (unbiased for |μ_i|²)
    noise_i  = |g_i^A − g_i^B|² / 4      (unbiased for E|g_i − μ_i|², g_i = (g_i^A + g_i^B)/2 the batch's)

and a cell records their means over seeds, so the ratio is the signal-to-noise of the whole batch's
gradient of reward i at that iteration. It needs no second batch and works at any iteration (the
seeds' networks differ after the first).
"""

from __future__ import annotations

import numpy as np
import torch

from recast_cli.policy.sde import sde_step


def measured_iterations(max_steps: int) -> tuple[int, ...]:
    """The iterations (0-based) whose gradients are measured: the first, a third and two thirds of the
    way, and the last. Each costs about one iteration more (2m gradients over every pair), so four
    keep a cell within about a sixth of its time without them (30 iterations)."""
    return tuple(sorted({0, max_steps // 3, 2 * max_steps // 3, max_steps - 1}))


def half_masks(groups: int, group_size: int, trained: int) -> torch.Tensor | None:
    """[2, P] 0/1 masks of the pairs (p = image·K + k) in the first and second half of the groups;
    None for an odd number of groups (no two halves of equal size)."""
    if groups % 2:
        return None
    images = groups * group_size
    first = (torch.arange(images) < images // 2).to(torch.float64).repeat_interleave(trained)
    return torch.stack([first, 1.0 - first])


def reward_gradients(trainer, states: torch.Tensor, exact: torch.Tensor, adv: torch.Tensor) \
        -> tuple[np.ndarray, np.ndarray] | None:
    """(signal [S, m], noise [S, m]) of each seed's per-reward gradient at its current parameters
    (see the module docstring); None when the groups do not split in two halves."""
    split = split_gradients(trainer, states, exact, adv)
    if split is None:
        return None
    a, b = split[:, 0], split[:, 1]
    return (a * b).sum(-1).T.numpy(), (((a - b) ** 2).sum(-1) / 4).T.numpy()


def split_gradients(trainer, states: torch.Tensor, exact: torch.Tensor, adv: torch.Tensor) -> torch.Tensor | None:
    """g_i^h [m, 2, S, parameters] (float64, the parameters flattened in the network's order): reward i's
    gradient from half h of each seed's groups; their mean over h, summed over i, is the first
    update's gradient when the ±adv_clip clip does not bind and β_KL = 0. None for an odd number of groups.

    ``trainer`` is the cell's :class:`~recast_cli.train.stacked.BatchedTrainer`; ``states``, ``exact``
    the iteration's trajectories and v* ([S, B, T+1], [S, B, T]); ``adv`` the per-reward group
    advantages A_i [S, B, m]. One backward pass per micro-batch gives all 2m gradients (batched
    over the reward × half coefficients)."""
    cell, cfg, S, T = trainer.cell, trainer.cfg, trainer.S, trainer.T
    B, m = adv.shape[1], adv.shape[2]
    steps = torch.tensor(cell.trained_steps, dtype=torch.int64)
    K = len(steps)
    halves = half_masks(B // cfg.group_size, cfg.group_size, K)
    if halves is None:
        return None
    P = B * K
    j = T - steps
    x = states[:, :, j].reshape(S, P)
    prev = states[:, :, j + 1].reshape(S, P)
    v_star = exact[:, :, j].reshape(S, P)
    sigma = trainer.sigmas[steps].expand(S, B, -1).reshape(S, P)
    sigma_next = trainer.sigmas[steps - 1].expand(S, B, -1).reshape(S, P)
    # c[i, h, s, p] = −(2/P)·T'·W_{i,t_p}·A_i(image_p)·1{p in half h}: each half's mean over its P/2 pairs
    weights = trainer.W[:, steps - 1] * K  # [m, K]
    per_pair = (adv.permute(2, 0, 1).unsqueeze(-1) * weights[:, None, None, :]).reshape(m, S, P)
    coef = -(2.0 / P) * per_pair.unsqueeze(1) * halves.view(1, 2, 1, P)  # [m, 2, S, P]
    coef = coef.reshape(2 * m, S, P)
    sums = [torch.zeros((2 * m, *p.shape), dtype=torch.float64) for p in trainer.net.params]
    size = max(1, min(cfg.micro_batch, (1 << 15) // S))
    for lo in range(0, P, size):
        part = slice(lo, min(lo + size, P))
        with torch.enable_grad():
            v = trainer.velocity(x[:, part], sigma[:, part], exact=v_star[:, part])
            _, _, _, lp = sde_step(x[:, part].reshape(-1, 1), v.reshape(-1, 1), sigma[:, part].reshape(-1),
                                   sigma_next[:, part].reshape(-1), cell.noise_level,
                                   prev_sample=prev[:, part].reshape(-1, 1))
            grads = torch.autograd.grad(lp.view(S, -1), trainer.net.params,
                                        grad_outputs=coef[:, :, part].to(lp.dtype), is_grads_batched=True)
        for total, g in zip(sums, grads):
            total += g.to(torch.float64)
    return torch.cat([g.reshape(m, 2, S, -1) for g in sums], dim=-1)


def summarise(iterations: list[int], signals: list[np.ndarray], noises: list[np.ndarray],
              rewards: tuple[str, ...]) -> dict:
    """The cell's record: per measured iteration (1-based) and reward, the means over seeds of the signal
    and the noise, the signal's standard error over seeds, and their ratio (the batch gradient's SNR)."""
    S = signals[0].shape[0] if signals else 0
    out: dict = {"iterations": iterations, "what": "per reward: split-half signal g_A·g_B and noise |g_A − g_B|²/4 "
                 "of the first update's gradient, means over seeds (batched/gradients.py)"}
    for key, values in (("signal", signals), ("noise", noises)):
        out[key] = {r: [float(v[:, i].mean()) for v in values] for i, r in enumerate(rewards)}
    out["signal_se"] = {r: [float(v[:, i].std(ddof=1) / np.sqrt(S)) if S > 1 else None for v in signals]
                        for i, r in enumerate(rewards)}
    out["snr"] = {r: [s / n if n > 0 else None for s, n in zip(out["signal"][r], out["noise"][r])] for r in rewards}
    return out

"""E1: the SDE step equals its closed form; a = 0 is Euler; log-probabilities are Gaussian densities."""

from __future__ import annotations

import math

import numpy as np
import torch

from recast_cli.policy.sde import sde_step


def closed_form(x, v, sigma, sigma_next, a):
    """METHOD.md §1 written out in float64 numpy, independently of the implementation."""
    x, v = x.double().numpy(), v.double().numpy()
    out_mean, out_std = [], []
    for i in range(len(sigma)):
        s_, n_ = float(sigma[i]), float(sigma_next[i])
        dt = n_ - s_
        s = a * math.sqrt(s_ / (1 - (n_ if s_ == 1 else s_)))
        out_mean.append(x[i] + v[i] * dt + (s**2 / (2 * s_)) * (x[i] + (1 - s_) * v[i]) * dt)
        out_std.append(s * math.sqrt(-dt))
    return np.stack(out_mean), np.array(out_std)


def test_mean_std_and_log_prob_match_the_closed_form_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(6, 3, 4, 4, generator=gen, dtype=torch.float64), torch.randn(6, 3, 4, 4, generator=gen,
                                                                                  dtype=torch.float64)
    sigma = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.2, 0.05], dtype=torch.float64)
    sigma_next = torch.tensor([0.96, 0.8, 0.69, 0.3, 0.1, 0.0], dtype=torch.float64)
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    x_next, mean, std, log_prob = sde_step(x, v, sigma, sigma_next, 0.7, noise=noise)
    ref_mean, ref_std = closed_form(x, v, sigma, sigma_next, 0.7)
    np.testing.assert_allclose(mean.numpy(), ref_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(std.numpy(), ref_std, rtol=1e-12)
    np.testing.assert_allclose(x_next.numpy(), ref_mean + ref_std[:, None, None, None] * noise.numpy(), atol=1e-12)
    # log-probability: Gaussian log-density under the returned mean/std, averaged over non-batch dims
    dist = torch.distributions.Normal(mean, std.view(-1, 1, 1, 1))
    np.testing.assert_allclose(log_prob.numpy(), dist.log_prob(x_next).mean(dim=(1, 2, 3)).numpy(), rtol=1e-12)


def test_prev_sample_is_scored_not_resampled():
    x, v = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    sigma, sigma_next = torch.full((3,), 0.6, dtype=torch.float64), torch.full((3,), 0.5, dtype=torch.float64)
    given = torch.randn(3, 8, dtype=torch.float64)
    x_next, mean, std, log_prob = sde_step(x, v, sigma, sigma_next, 1.0, prev_sample=given)
    assert torch.equal(x_next, given)
    expected = torch.distributions.Normal(mean, std.view(-1, 1)).log_prob(given).mean(dim=1)
    torch.testing.assert_close(log_prob, expected)


def test_noise_level_zero_is_the_euler_step():
    x, v = torch.randn(4, 5), torch.randn(4, 5)
    sigma, sigma_next = torch.tensor([1.0, 0.8, 0.5, 0.1]), torch.tensor([0.8, 0.5, 0.1, 0.0])
    x_next, mean, std, log_prob = sde_step(x, v, sigma, sigma_next, 0.0)
    torch.testing.assert_close(x_next, x + v * (sigma_next - sigma).view(-1, 1))
    assert torch.equal(std, torch.zeros(4)) and log_prob is None


def test_sigma_one_uses_the_next_level_in_the_denominator():
    x, v = torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    _, _, std, _ = sde_step(x, v, torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.75], dtype=torch.float64),
                            0.7)
    assert float(std) == math.sqrt(1.0 / (1 - 0.75)) * 0.7 * math.sqrt(0.25)

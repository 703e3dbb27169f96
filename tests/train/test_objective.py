"""The training objective (METHOD.md §6) against independent references: pure tensors, no model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recast_cli.train.config import skip_clean_of, trained_steps
from recast_cli.train.objective import ADV_EPS, gaussian_kl, group_advantages, pair_loss, ppo_terms, step_advantages


def _rewards(groups: int, G: int, m: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # rewards on different scales per column, so a std over the wrong axis shows
    return rng.normal(size=(groups * G, m)) * np.array([1.0, 10.0, 0.1])[:m] + np.array([0.0, 5.0, -3.0])[:m]


def _numpy_group_advantages(r: np.ndarray, G: int, global_std: bool) -> np.ndarray:
    out = np.empty_like(r)
    std_all = r.std(axis=0, ddof=0)
    for g in range(r.shape[0] // G):
        block = r[g * G:(g + 1) * G]
        std = std_all if global_std else block.std(axis=0, ddof=0)
        out[g * G:(g + 1) * G] = (block - block.mean(axis=0)) / (std + 1e-4)
    return out


@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("global_std", [False, True])
def test_group_advantages_match_a_numpy_reference(G, global_std):
    r = _rewards(3, G, 3)
    adv = group_advantages(torch.from_numpy(r).float(), G, global_std=global_std)
    assert adv.dtype == torch.float64 and adv.shape == r.shape
    ref = _numpy_group_advantages(r.astype(np.float32).astype(np.float64), G, global_std)
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-12, atol=1e-12)
    assert ADV_EPS == 1e-4


def test_group_and_global_std_differ_and_a_constant_group_has_zero_advantage():
    r = _rewards(3, 4, 3)
    r[4:8, 1] = 7.0  # group 1 constant in reward 1
    a = group_advantages(torch.from_numpy(r), 4, global_std=False)
    b = group_advantages(torch.from_numpy(r), 4, global_std=True)
    assert not torch.allclose(a, b)
    assert torch.equal(a[4:8, 1], torch.zeros(4, dtype=torch.float64))
    # group std: every non-constant group column is standardised to about unit population std
    np.testing.assert_allclose(a.view(3, 4, 3)[0].std(dim=0, unbiased=False).numpy(), 1.0, atol=1e-2)  # the 1e-4 in the denominator


def test_group_advantages_reject_a_batch_that_does_not_split_into_groups():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5, 2), 2)


def test_step_advantages_are_E13_elementwise_for_a_random_W():
    rng = np.random.default_rng(1)
    m, T, B = 3, 7, 6
    W = rng.random((m, T))
    W /= W.sum()
    adv = rng.normal(size=(B, m))
    got = step_advantages(torch.from_numpy(adv), torch.from_numpy(W)).numpy()
    assert got.shape == (B, T)
    for b in range(B):
        for t in range(1, T + 1):
            expected = T * sum(W[i, t - 1] * adv[b, i] for i in range(m))
            assert got[b, t - 1] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_a_static_W_gives_the_lambda_hat_weighted_sum_at_every_step():
    rng = np.random.default_rng(2)
    lam = np.array([1.0, 2.0, 1.0])
    lam_hat = lam / lam.sum()
    T, B = 5, 8
    W = np.repeat(lam_hat[:, None] / T, T, axis=1)
    adv = rng.normal(size=(B, 3))
    got = step_advantages(torch.from_numpy(adv), torch.from_numpy(W)).numpy()
    expected = adv @ lam_hat
    for t in range(T):
        np.testing.assert_allclose(got[:, t], expected, rtol=1e-12, atol=1e-14)


def test_step_advantages_clip_at_plus_minus_clip():
    W = torch.tensor([[0.5, 0.0], [0.0, 0.5]], dtype=torch.float64)  # T = 2: A_t = A_t-th reward
    adv = torch.tensor([[7.0, -9.0], [2.0, -3.0], [-5.5, 5.0]], dtype=torch.float64)
    got = step_advantages(adv, W, clip=5.0)
    expected = torch.tensor([[5.0, -5.0], [2.0, -3.0], [-5.0, 5.0]], dtype=torch.float64)
    assert torch.equal(got, expected)
    assert torch.equal(step_advantages(adv, W), adv)  # no clip: untouched


def test_ppo_terms_equal_the_clipped_surrogate_and_flag_ratios_outside_the_band():
    rng = np.random.default_rng(3)
    n, eps = 200, 0.2
    lp = rng.normal(size=n) * 0.3
    old = rng.normal(size=n) * 0.3
    A = rng.normal(size=n) * 2
    loss, clipped = ppo_terms(torch.from_numpy(lp), torch.from_numpy(old), torch.from_numpy(A), eps)
    ratio = np.exp(lp - old)
    expected = np.maximum(-A * ratio, -A * np.clip(ratio, 1 - eps, 1 + eps))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-12, atol=1e-14)
    # Flow-GRPO's clip fraction: the ratio left the band [1 − ε, 1 + ε]
    np.testing.assert_array_equal(clipped.numpy(), np.abs(ratio - 1) > eps)
    assert clipped.any() and not clipped.all()


def test_ppo_gradient_vanishes_exactly_where_the_clipped_term_is_taken():
    lp = torch.tensor([0.5, 0.5, -0.5, -0.5, 0.0], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(5, dtype=torch.float64)
    A = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    loss, _ = ppo_terms(lp, old, A, 0.2)
    loss.sum().backward()
    # ρ > 1 + ε with A > 0 and ρ < 1 − ε with A < 0: clipped, no gradient; otherwise −A·ρ
    expected = torch.tensor([0.0, np.exp(0.5), -np.exp(-0.5), 0.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, expected, rtol=1e-12, atol=1e-14)


def test_exact_gaussian_kl_is_the_mean_elementwise_kl_of_equal_std_normals():
    torch.manual_seed(0)
    B = 4
    mean = torch.randn(B, 2, 3, 3, dtype=torch.float64)
    ref = mean + 0.3 * torch.randn(B, 2, 3, 3, dtype=torch.float64)
    s = torch.tensor([0.4, 0.7, 1.1, 2.0], dtype=torch.float64)
    dt = torch.tensor([-0.1, -0.25, -0.05, -0.3], dtype=torch.float64)
    std = s * torch.sqrt(-dt)  # the transition's std (what sde_step returns)
    got = gaussian_kl(mean, ref, std, dt, "exact")
    scale = std.view(B, 1, 1, 1).expand_as(mean)
    per_element = torch.distributions.kl_divergence(torch.distributions.Normal(mean, scale),
                                                    torch.distributions.Normal(ref, scale))
    torch.testing.assert_close(got, per_element.mean(dim=(1, 2, 3)), rtol=1e-12, atol=1e-15)
    assert got.shape == (B,) and torch.all(got > 0)
    # std given as [B, 1, 1, 1] (the shape sde_step broadcasts with) reads the same
    torch.testing.assert_close(gaussian_kl(mean, ref, std.view(B, 1, 1, 1), dt.view(B, 1, 1, 1)), got)


def test_flowgrpo_kl_omits_the_dt_factor():
    """Flow-GRPO divides by 2·s² instead of 2·s²·(−dt): flowgrpo = exact·(−dt)."""
    torch.manual_seed(1)
    mean = torch.randn(3, 4, 2, 2, dtype=torch.float64)
    ref = torch.randn(3, 4, 2, 2, dtype=torch.float64)
    s = torch.tensor([0.5, 0.9, 1.3], dtype=torch.float64)
    dt = torch.tensor([-0.2, -0.02, -0.5], dtype=torch.float64)
    std = s * torch.sqrt(-dt)
    exact = gaussian_kl(mean, ref, std, dt, "exact")
    flow = gaussian_kl(mean, ref, std, dt, "flowgrpo")
    torch.testing.assert_close(flow, exact * (-dt), rtol=1e-12, atol=1e-15)
    sq = ((mean - ref) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(flow, sq / (2 * s ** 2), rtol=1e-12, atol=1e-15)
    assert torch.equal(gaussian_kl(mean, mean, std, dt), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError):
        gaussian_kl(mean, ref, std, dt, "nosuchform")


def test_pair_loss_is_the_ppo_term_plus_beta_kl_times_the_kl_on_any_leading_shape():
    """One run's pairs [n] and a stack of seeds' [S, n] give the same per-pair terms; β_KL = 0 reads no KL input."""
    gen = torch.Generator().manual_seed(4)
    S, n, beta = 3, 5, 0.05
    lp, old, A = (0.3 * torch.randn(S, n, generator=gen, dtype=torch.float64) for _ in range(3))
    mean = torch.randn(S * n, 1, generator=gen, dtype=torch.float64)
    ref = mean + 0.1 * torch.randn(S * n, 1, generator=gen, dtype=torch.float64)
    dt = -torch.rand(S * n, generator=gen, dtype=torch.float64) * 0.2
    std = 0.7 * torch.sqrt(-dt)
    stacked = pair_loss(lp, old, A, clip_range=0.2, beta_kl=beta, mean=mean, ref_mean=ref, std=std, dt=dt)
    pg, clipped = ppo_terms(lp, old, A, 0.2)
    kl = gaussian_kl(mean, ref, std, dt).view(S, n)
    assert torch.equal(stacked.policy_loss, pg) and torch.equal(stacked.kl, kl)
    assert torch.equal(stacked.clipped, clipped.float()) and torch.equal(stacked.loss, pg + beta * kl)
    flat = pair_loss(lp.reshape(-1), old.reshape(-1), A.reshape(-1), clip_range=0.2, beta_kl=beta, mean=mean,
                     ref_mean=ref, std=std, dt=dt)
    assert all(torch.equal(a.reshape(S, n), b) for a, b in zip(flat, stacked))
    plain = pair_loss(lp, old, A, clip_range=0.2)
    assert torch.equal(plain.loss, pg) and torch.equal(plain.kl, torch.zeros_like(pg))


def test_trained_steps_default_to_all_but_the_cleanest_noisiest_first():
    assert trained_steps(4, None) == [4, 3, 2]
    assert trained_steps(25, None) == list(range(25, 1, -1))
    assert trained_steps(1, None) == [1]


@pytest.mark.parametrize("T, fraction, expected", [
    (4, 1.0, [4, 3, 2, 1]),
    (4, 0.5, [4, 3]),
    (4, 0.6, [4, 3]),  # int(T·f), noisiest first
    (4, 0.1, [4]),  # at least one step
    (10, 0.3, [10, 9, 8]),
])
def test_trained_steps_with_a_fraction(T, fraction, expected):
    assert trained_steps(T, fraction) == expected
    # solve-w --skip-clean K with K = skip_clean_of puts W on exactly these steps: K + 1 … T
    assert sorted(expected) == list(range(skip_clean_of(T, fraction) + 1, T + 1))

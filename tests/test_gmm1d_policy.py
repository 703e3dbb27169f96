"""The exact gmm1d world (METHOD.md §4) as a policy: exact D curves, posterior, π⁺, velocity, ODE transport."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from recast_cli.errors import BadInput
from recast_cli.policy.gmm1d import MEANS, REWARDS, STD, GMM1DPolicy, exact_gain_table
from recast_cli.policy.world1d import BETA, DEFAULT_WORLD


@pytest.fixture(scope="module")
def table():
    return exact_gain_table(steps=25, alpha=2.0)


def test_exact_curves_at_alpha_2_share_d0_and_peak_at_18_7_2(table):
    np.testing.assert_allclose(table.D[:, 0], 0.45744109, atol=5e-9)
    assert (np.diff(table.D, axis=1) <= 1e-12).all()  # non-increasing in t
    assert np.abs(table.D[:, -1]).max() < 1e-9  # ≈ 0 at pure noise
    assert table.peak_step().tolist() == [18, 7, 2]


def test_other_orders_kl_and_half_match_the_closed_form_at_the_data_level():
    z = 1 + 0.5 * np.expm1(1 / BETA)
    ratio, prob = np.array([np.exp(1 / BETA), 1.0]) / z, np.array([0.5, 0.5])
    kl = float(np.sum(prob * ratio * np.log(ratio)))
    half = float(np.log(np.sum(prob * ratio**0.5)) / (0.5 - 1))
    for reward in REWARDS:
        assert abs(DEFAULT_WORLD.exact_discriminability(reward, 0.0, alpha=1.0) - kl) < 1e-6
        assert abs(DEFAULT_WORLD.exact_discriminability(reward, 0.0, alpha=0.5) - half) < 1e-6
    # α → 1 is the KL, also at a noisy level; order is monotone in α (Rényi).
    d = [DEFAULT_WORLD.exact_discriminability("mid", 0.3, alpha=a) for a in (0.5, 0.999, 1.0, 1.001, 2.0)]
    assert abs(d[1] - d[2]) < 1e-3 and abs(d[3] - d[2]) < 1e-3
    assert d[0] < d[2] < d[4]
    curve = [DEFAULT_WORLD.exact_discriminability("coarse", s, alpha=1.0) for s in np.linspace(0, 1, 11)]
    assert (np.diff(curve) <= 1e-12).all() and abs(curve[-1]) < 1e-9


def test_non_positive_order_or_temperature_is_bad_input():
    with pytest.raises(BadInput, match="alpha > 0"):
        DEFAULT_WORLD.exact_discriminability("coarse", 0.5, alpha=0.0)
    with pytest.raises(BadInput, match="beta > 0"):
        DEFAULT_WORLD.exact_discriminability("coarse", 0.5, alpha=2.0, beta=-1.0)
    with pytest.raises(BadInput, match="no reward"):
        DEFAULT_WORLD.reward_value("sharp", np.zeros(3))


def test_rewards_are_the_documented_indicators():
    x = np.array([-2.5, -1.9, -0.1, 0.1, 0.3, 2.1])
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("coarse", x), [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("mid", x), [1, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("fine", x), [1, 0, 1, 0, 1, 0])  # odd cells of width 0.2
    for reward in REWARDS:  # each has P(r = 1) = 1/2 under π^old
        assert abs(DEFAULT_WORLD.reward_value(reward, DEFAULT_WORLD.sample_old(200_000, seed=1)).mean() - 0.5) < 0.005


def test_old_and_positive_samples_follow_their_densities():
    assert stats.kstest(DEFAULT_WORLD.sample_old(4000, seed=2), DEFAULT_WORLD.old_cdf).pvalue > 1e-3
    for reward in REWARDS:
        plus = DEFAULT_WORLD.sample_positive(reward, 4000, seed=3)
        assert len(plus) == 4000
        assert stats.kstest(plus, lambda v, r=reward: DEFAULT_WORLD.positive_cdf(r, v)).pvalue > 1e-3
        # The tilt exp(r/β) with β = 0.5 gives P⁺(r = 1) = e²/(e² + 1).
        assert abs(DEFAULT_WORLD.reward_value(reward, plus).mean() - np.exp(2) / (np.exp(2) + 1)) < 0.02
    # The positives are not the old policy: the test above can fail.
    old = DEFAULT_WORLD.sample_old(4000, seed=4)
    assert stats.kstest(old, lambda v: DEFAULT_WORLD.positive_cdf("coarse", v)).pvalue < 1e-6


@pytest.mark.parametrize("x_t, t", [(0.3, 20), (-1.2, 10), (1.9, 5), (2.0, 1)])
def test_rollouts_draw_the_exact_posterior(x_t, t):
    policy = GMM1DPolicy(steps=25)
    n = 3000
    x0 = policy.rollout(torch.full((n, 1), x_t, dtype=torch.float64), torch.full((n,), t),
                        policy.encode_prompts([""] * n), noise_level=1.0, seeds=torch.arange(n)).numpy()[:, 0]
    sigma = float(policy.sigmas[t])
    assert stats.kstest(x0, lambda v: DEFAULT_WORLD.posterior_cdf(v, x_t, sigma)).pvalue > 1e-3
    if t >= 5:  # a neighbouring level's posterior is a different law: the test has power
        other = float(policy.sigmas[t - 4])
        assert stats.kstest(x0, lambda v: DEFAULT_WORLD.posterior_cdf(v, x_t, other)).pvalue < 1e-3


def test_posterior_matches_a_monte_carlo_bayes_update():
    # Independent of the closed form: weight prior draws by the noising likelihood N(x; (1−σ)x0, σ²).
    prior = DEFAULT_WORLD.sample_old(400_000, seed=5)
    x_t, sigma = 0.8, 0.6
    w = stats.norm.pdf(x_t, (1 - sigma) * prior, sigma)
    grid = np.linspace(-3, 3, 13)
    mc = np.array([(w * (prior <= g)).sum() / w.sum() for g in grid])
    np.testing.assert_allclose(DEFAULT_WORLD.posterior_cdf(grid, x_t, sigma), mc, atol=0.01)


def test_rollouts_are_deterministic_in_seed_mixed_t_and_validated():
    policy = GMM1DPolicy(steps=25)
    x = torch.tensor([[0.5], [0.5], [-1.0]], dtype=torch.float64)
    t = torch.tensor([3, 12, 25])
    cond = policy.encode_prompts(["a", "b", "c"])
    seeds = torch.tensor([7, 7, 8])
    first = policy.rollout(x, t, cond, 1.414, seeds)
    torch.testing.assert_close(first, policy.rollout(x, t, cond, 1.414, seeds), rtol=0, atol=0)
    alone = torch.cat([policy.rollout(x[i:i + 1], t[i:i + 1], cond.take(torch.tensor([i])), 1.414, seeds[i:i + 1])
                       for i in range(3)])
    torch.testing.assert_close(first, alone, rtol=0, atol=0)  # a sample's draw does not depend on the batch
    with pytest.raises(BadInput, match="1..25"):
        policy.rollout(x, torch.tensor([0, 1, 2]), cond, 1.0, seeds)
    with pytest.raises(BadInput, match="1..25"):
        policy.rollout(x, torch.tensor([26, 1, 2]), cond, 1.0, seeds)
    with pytest.raises(BadInput, match="noise level"):
        policy.rollout(x, t, cond, -0.1, seeds)


def test_one_seed_gives_coupled_draws_at_neighbouring_steps():
    policy = GMM1DPolicy(steps=25)
    n = 2000
    x0 = torch.from_numpy(DEFAULT_WORLD.sample_old(n, seed=9)).view(-1, 1)
    eps = torch.from_numpy(np.random.default_rng(10).standard_normal((n, 1)))
    cond = policy.encode_prompts([""] * n)

    def draws(t: int, seeds: torch.Tensor) -> np.ndarray:
        x_t = policy.forward_noise(x0, policy.sigmas[torch.full((n,), t)], eps)
        return policy.rollout(x_t, torch.full((n,), t), cond, 1.414, seeds).numpy()[:, 0]

    same = np.mean(np.abs(draws(10, torch.arange(n)) - draws(11, torch.arange(n))))
    fresh = np.mean(np.abs(draws(10, torch.arange(n)) - draws(11, torch.arange(n) + n)))
    assert same < 0.5 * fresh  # common random numbers across start steps


def test_velocity_is_the_conditional_mean_of_eps_minus_x0():
    policy = GMM1DPolicy(steps=25)
    prior = DEFAULT_WORLD.sample_old(400_000, seed=11)
    cond = policy.encode_prompts([""] * 4)
    for sigma in (0.2, 0.5, 0.9):
        # Typical points of π^old_σ (x_0 near a mode, moderate ε): the Monte-Carlo weights are not degenerate there.
        xs = torch.tensor([[-2.0], [-1.6], [1.7], [2.4]], dtype=torch.float64) * (1 - sigma) + sigma * torch.tensor(
            [[0.5], [-0.3], [0.0], [1.0]], dtype=torch.float64)
        v = policy.velocity(xs, torch.full((4,), sigma, dtype=torch.float64), cond).numpy()[:, 0]
        for x, vx in zip(xs.numpy()[:, 0], v):
            eps = (x - (1 - sigma) * prior) / sigma  # the ε that maps each x0 to this x
            w = stats.norm.pdf(eps)  # likelihood of x given x0 (up to the constant 1/σ)
            mc = (w * (eps - prior)).sum() / w.sum()
            assert abs(vx - mc) < 0.02 * max(1.0, abs(mc)), (sigma, x, vx, mc)
    # At pure noise x_1 = ε and E[x_0] = 0, so v = x.
    xs = torch.tensor([[-1.5], [0.0], [0.7], [2.2]], dtype=torch.float64)
    torch.testing.assert_close(policy.velocity(xs, torch.ones(4, dtype=torch.float64), cond), xs)


def test_ode_with_the_exact_velocity_transports_noise_to_the_old_policy():
    policy = GMM1DPolicy(steps=200)
    n = 1500
    traj = policy.sample(policy.encode_prompts([""] * n), noise_level=0.0, seeds=torch.arange(n))
    assert traj.states.shape == (n, 201, 1) and traj.log_probs is None
    end = traj.states[:, -1, 0].numpy()
    assert stats.kstest(end, DEFAULT_WORLD.old_cdf).pvalue > 1e-3
    # Samples land on the modes: a quarter near each mean.
    nearest = np.abs(end[:, None] - MEANS[None, :]).argmin(1)
    assert np.abs(np.bincount(nearest, minlength=4) / n - 0.25).max() < 0.05
    assert np.abs(end[:, None] - MEANS[None, :]).min(1).mean() < 2 * STD


def test_shared_sde_rollouts_on_the_exact_velocity_sample_the_posterior_only_at_a_sqrt2():
    # METHOD.md §4, rollout kernel: a = √2 is the exact time reversal; Flow-GRPO's a = 0.7 is not.
    policy = GMM1DPolicy(steps=50, exact_rollouts=False)
    n, t, x_t = 2000, 20, 1.0
    cond = policy.encode_prompts([""] * n)

    def ks(a: float) -> float:
        start = torch.full((n, 1), x_t, dtype=torch.float64)
        x0 = policy.rollout(start, torch.full((n,), t), cond, a, torch.arange(n)).numpy()[:, 0]
        return stats.kstest(x0, lambda v: DEFAULT_WORLD.posterior_cdf(v, x_t, float(policy.sigmas[t]))).pvalue

    assert ks(2**0.5) > 1e-3
    assert ks(0.7) < 1e-6


def test_policy_protocol_shapes_and_identity_maps():
    policy = GMM1DPolicy(steps=25)
    assert policy.T == 25 and policy.latent_shape == (1,) and policy.dtype == torch.float64
    assert policy.device == torch.device("cpu")
    np.testing.assert_array_equal(policy.sigmas.numpy(), np.arange(26) / 25)
    x = torch.randn(5, 1, dtype=torch.float64)
    torch.testing.assert_close(policy.decode(x), x)
    torch.testing.assert_close(policy.encode(policy.decode(x)), x)
    assert policy.encode_prompts(["p", "q", "r"]).take(torch.tensor([2, 0])).prompts == ("r", "p")
    with pytest.raises(BadInput, match="steps"):
        GMM1DPolicy(steps=0)


def test_pplus_estimate_from_rollouts_recovers_the_exact_curve(table):
    # E6 in miniature: noise π⁺ positives to x_t, roll out K = 1 exact posterior draws, D̂ = log mean ĥ − (same at T).
    policy = GMM1DPolicy(steps=25)
    n = 6000
    plus = torch.from_numpy(DEFAULT_WORLD.sample_positive("coarse", n, seed=12)).view(-1, 1)
    eps = torch.from_numpy(np.random.default_rng(13).standard_normal((n, 1)))
    cond = policy.encode_prompts([""] * n)

    def d_prime(t: int) -> float:
        x_t = policy.forward_noise(plus, policy.sigmas[torch.full((n,), t)], eps)
        x0 = policy.rollout(x_t, torch.full((n,), t), cond, 1.414, torch.arange(n)).numpy()[:, 0]
        return float(np.log(np.mean(np.exp(DEFAULT_WORLD.reward_value("coarse", x0) / BETA))))

    shift = d_prime(25)
    for t in (12, 18, 24):
        assert abs((d_prime(t) - shift) - table.D[0, t]) < 0.04, t

"""E9-E12: the weight matrix solver, checked against closed forms and POT."""

from __future__ import annotations

import numpy as np
import ot
import pytest

from recast_cli.grid import GridSpec
from recast_cli.solve.sinkhorn import (
    indiscriminable_rows,
    log_affinity,
    mean_normalised_gain,
    resample_gains,
    sinkhorn_log,
    solve_weights,
    spill_share,
)
from tests.conftest import bump_gains

LAMBDAS = [np.array([1.0, 1.0, 1.0, 1.0]), np.array([1.0, 1.0, 2.0, 1.0]), np.array([2.0, 1.0, 1.0, 3.0])]


@pytest.fixture
def gain() -> np.ndarray:
    return 0.03 * bump_gains([20, 12, 5, 2], [4, 3, 2, 1], 25)


@pytest.mark.parametrize("lam", LAMBDAS)
def test_sinkhorn_rows_sum_to_lambda_hat_and_columns_to_one_over_T(gain, lam):
    sol = solve_weights(gain, lam, mode="recast")
    assert np.abs(sol.W.sum(axis=1) - lam / lam.sum()).max() <= 1e-10
    assert np.abs(sol.W.sum(axis=0) - 1 / 25).max() <= 1e-10
    assert sol.error <= 1e-10
    assert sol.iterations > 0


@pytest.mark.parametrize("lam", LAMBDAS)
@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_sinkhorn_equals_pot_log_domain_solver(gain, lam, tau):
    sol = solve_weights(gain, lam, mode="recast", tau=tau)
    a, b = lam / lam.sum(), np.full(25, 1 / 25)
    # POT minimises <W, M> - reg·H(W), i.e. kernel exp(-M/reg): M = -ΔD̄, reg = τ gives K = exp(ΔD̄/τ).
    M = -mean_normalised_gain(gain, indiscriminable_rows(gain))
    ref = ot.sinkhorn(a, b, M, tau, method="sinkhorn_log", stopThr=1e-14, numItermax=200_000)
    assert np.abs(sol.W - ref).max() <= 1e-9


def test_static_mode_is_lambda_hat_over_T(gain):
    lam = np.array([1.0, 2.0, 3.0, 4.0])
    W = solve_weights(gain, lam, mode="static").W
    np.testing.assert_allclose(W, np.repeat((lam / 10)[:, None], 25, axis=1) / 25, rtol=0, atol=1e-15)


def test_nosink_mode_is_row_normalised_kernel(gain):
    lam = np.array([1.0, 1.0, 2.0, 1.0])
    W = solve_weights(gain, lam, mode="nosink", tau=0.7).W
    K = np.exp(mean_normalised_gain(gain, indiscriminable_rows(gain)) / 0.7)
    expected = (lam / lam.sum())[:, None] * K / K.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(W, expected, rtol=1e-12, atol=0)
    assert np.abs(W.sum(axis=0) - 1 / 25).max() > 1e-3  # columns are not balanced without Sinkhorn


def test_large_tau_tends_to_static(gain):
    lam = np.array([1.0, 2.0, 1.0, 1.0])
    W = solve_weights(gain, lam, mode="recast", tau=1e6).W
    np.testing.assert_allclose(W, solve_weights(gain, lam, mode="static").W, atol=1e-6)


def test_weight_follows_the_informative_window(gain):
    W = solve_weights(gain, np.ones(4)).W
    assert list(W.argmax(axis=1) + 1) == [20, 12, 5, 2]


def test_mean_normalised_gain_has_mean_one_and_uniform_indiscriminable_rows():
    gain = np.array([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0], [1e-9, 0.0, 0.0]])
    low = indiscriminable_rows(gain)
    assert low.tolist() == [False, False, True]
    normalised = mean_normalised_gain(gain, low)
    np.testing.assert_allclose(normalised.mean(axis=1), 1.0)
    np.testing.assert_array_equal(normalised[2], np.ones(3))
    np.testing.assert_allclose(normalised[0], [0.0, 0.75, 2.25])


def test_bootstrap_noise_marks_rows_indiscriminable():
    gain = np.array([[0.1, 0.2], [0.05, 0.05]])
    assert indiscriminable_rows(gain, noise=np.array([0.01, 0.2])).tolist() == [False, True]


def test_log_domain_solver_survives_kernels_beyond_float_range():
    # One-hot gains at T = 1000 give ΔD̄ = 1000 at one step: exp(1000) overflows a plain kernel.
    steps = 1000
    gain = np.zeros((3, steps))
    gain[0, 3], gain[1, 500], gain[2, 990] = 1.0, 0.5, 2.0
    with np.errstate(over="raise"):
        with pytest.raises(FloatingPointError):
            np.exp(log_affinity(mean_normalised_gain(gain, indiscriminable_rows(gain))))
    sol = solve_weights(gain, np.array([1.0, 2.0, 1.0]))
    assert np.isfinite(sol.W).all()
    assert sol.error <= 1e-10
    assert sol.W[0, 3] == pytest.approx(sol.W[:, 3].sum(), rel=1e-9)


def test_sinkhorn_reports_iterations_and_error_directly():
    rng = np.random.default_rng(0)
    log_k = rng.uniform(0, 5, size=(6, 40))
    row = rng.uniform(1, 2, 6)
    row /= row.sum()
    res = sinkhorn_log(log_k, row, np.full(40, 1 / 40), tol=1e-12)
    assert res.error <= 1e-12
    assert np.abs(res.W.sum(axis=1) - row).max() <= 1e-12


def test_resampling_preserves_total_gain_across_grid_families(gain):
    linear = GridSpec("linear").sigmas(25)
    for target in (GridSpec("linear").sigmas(10), GridSpec("linear").sigmas(100),
                   GridSpec("flowmatch", shift=3.0).sigmas(10), GridSpec("flowmatch", shift=3.0).sigmas(40)):
        new = resample_gains(linear, gain, target)
        assert new.shape == (4, len(target) - 1)
        assert (new >= 0).all()
        np.testing.assert_allclose(new.sum(axis=1), gain.sum(axis=1), rtol=1e-12)


def test_resampling_onto_the_same_grid_is_the_identity(gain):
    sig = GridSpec("flowmatch", shift=3.0).sigmas(25)
    np.testing.assert_allclose(resample_gains(sig, gain, sig), gain, atol=1e-15)


def test_resampling_follows_sigma_not_index():
    # All of the gain sits between σ = 0.4 and 0.6 on a linear grid of 5 steps (step t = 3).
    sig = GridSpec("linear").sigmas(5)
    gain = np.array([[0.0, 0.0, 1.0, 0.0, 0.0]])
    new = resample_gains(sig, gain, GridSpec("linear").sigmas(10))
    assert new.sum() == pytest.approx(1.0)
    # On the 10-step grid that interval is steps 5 and 6; nothing lands outside [0.3, 0.7].
    assert new[0, 4] + new[0, 5] > 0.8
    assert new[0, [0, 1, 7, 8, 9]].sum() == pytest.approx(0.0, abs=1e-12)


def test_fine_reward_spills_about_sixty_percent_on_the_exact_gmm1d_world(example_path):
    from recast_cli.artifacts import read_gains

    table = read_gains(example_path)
    W = solve_weights(table.gain, np.ones(3)).W
    spill = dict(zip(table.rewards, spill_share(W, table.gain)))
    assert 0.55 < spill["fine"] < 0.65  # METHOD.md §5: ≈60% for `fine` at uniform λ
    assert spill["coarse"] < 0.1 and spill["mid"] < 0.1


def test_spill_share_counts_weight_below_one_percent_of_peak():
    gain = np.array([[1.0, 0.5, 0.005, 0.0]])
    W = np.array([[0.1, 0.1, 0.3, 0.5]])
    assert spill_share(W, gain)[0] == pytest.approx(0.8)
    assert np.isnan(spill_share(W, np.zeros((1, 4)))[0])

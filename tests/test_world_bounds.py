"""Every world is bounded by the work it implies (issue 40, findings 7, 8 and 16; docs/settings.md "Work limits").

A rare cell of high value is sampled exactly and at once (the rejection sampler would accept one draw in
10¹¹); a world whose exact quadrature grid or cells are too large, or whose numbers overflow float64, is
refused when it is read — by check-setting and by every command — with one line naming the number and the
limit; reward values too large for β and an α too large are named as such, before any NaN. Each refusal
comes before the work: every test here takes well under a second, and no RuntimeWarning may be raised.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp, ndtr

from recast_cli.errors import BadInput
from recast_cli.estimate.config import MAX_ALPHA, EstimateConfig, GainOptions
from recast_cli.estimate.gains import estimate_gains
from recast_cli.estimate.stage import exact_table
from recast_cli.policy import world1d
from recast_cli.policy.world1d import (BETA, DEFAULT_WORLD, MAX_LEVEL_WORK, MIN_ACCEPTANCE, StepReward,
                                       World1D)
from recast_cli.settings_check import check_setting
from tests.test_world_setting import invoke, setting

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow anywhere fails the test

#: Finding 7: one cell, 6.8 stds out of the right component, worth 100: π⁺ lives there almost entirely
#: (``s``: the setting's second training reward).
RARE = ("[world]\nmeans = [-1.0, 1.0]\nstds = 0.25\n\n[world.rewards.r]\nthreshold = 2.7\nabove = 100\n\n"
        "[world.rewards.s]\nthreshold = 0.0\n")
TWO = '["r", "s"]'


def rare_world() -> World1D:
    return World1D(weights=(0.5, 0.5), means=(-1.0, 1.0), stds=(0.25, 0.25),
                   rewards=(("r", StepReward(edges=(2.7,), values=(0.0, 100.0))),))


def refused(tmp_path, args, needle: str, seconds: float = 1.0) -> None:
    """``args`` exit 2 with one line holding ``needle``, no traceback, nothing written, within ``seconds``."""
    before = set(tmp_path.iterdir())
    start = time.perf_counter()
    result = invoke(*args)
    took = time.perf_counter() - start
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (args, result.stdout, result.stderr, result.exception)
    assert len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr
    assert set(tmp_path.iterdir()) == before
    assert took < seconds, f"{args} took {took:.2f} s: the refusal must come before the work"


# ---------------------------------------------------------------------- finding 7: a rare, high-value cell


def test_the_acceptance_rate_is_known_before_sampling_and_a_rare_cell_is_drawn_exactly():
    world = rare_world()
    top_mass = 0.5 * ndtr(-(2.7 - 1.0) / 0.25) + 0.5 * ndtr(-(2.7 + 1.0) / 0.25)
    expected = top_mass + (1 - top_mass) * np.exp(-100 / BETA)
    assert world.positive_acceptance("r") == pytest.approx(expected, rel=1e-9)
    assert world.positive_acceptance("r") < 1e-11 < MIN_ACCEPTANCE
    start = time.perf_counter()
    plus = world.sample_positive("r", 4000, seed=3, beta=BETA)
    assert time.perf_counter() - start < 0.5
    assert plus.shape == (4000,) and plus.min() >= 2.7  # π⁺ of the top cell: its rest weighs e^{-200}/1e-12
    assert stats.kstest(plus, lambda v: world.positive_cdf("r", v, BETA)).pvalue > 1e-3
    assert np.array_equal(plus, world.sample_positive("r", 4000, seed=3, beta=BETA))  # deterministic


@pytest.mark.parametrize("name", DEFAULT_WORLD.reward_names)
def test_the_exact_cell_sampler_draws_pi_plus_of_every_default_reward(name):
    """The method rare cells switch to is exact on ordinary worlds too (those keep rejection, unchanged)."""
    assert DEFAULT_WORLD.positive_acceptance(name) > MIN_ACCEPTANCE
    draws = DEFAULT_WORLD._sample_positive_cells(DEFAULT_WORLD.reward(name), 4000, np.random.default_rng(5), BETA)
    assert stats.kstest(draws, lambda v: DEFAULT_WORLD.positive_cdf(name, v, BETA)).pvalue > 1e-3


def test_check_setting_names_the_sampler_and_the_sampled_estimate_runs(tmp_path):
    path = setting(tmp_path, RARE, TWO, kind="gmm1d")
    check = invoke("check-setting", path)
    assert check.exit_code == 0, check.stderr
    rows = {row[0]: row[2] for row in check_setting(str(path)).rows}
    assert rows["reward r"].endswith("π⁺ by the exact inverse CDF of its tilted cells (rejection accepts 2.62e-12)")
    assert "exact estimate ≤ 9.6e+05 evaluations per noise level (limit 1e+08)" in rows["[world]"]
    start = time.perf_counter()
    result = invoke("estimate", "--policy", path, "--rewards", "r", "--n", "8", "--k", "1", "--p", "1", "--steps", "3",
                    "--bootstrap", "0", "--out", tmp_path / "g.parquet")
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert time.perf_counter() - start < 3.0


# ---------------------------------------------------------------------- finding 8: the exact estimate's work

WIDE = "[world]\nmeans = [{m}, {M}]\nstds = 0.25\n\n[world.rewards.r]\nthreshold = 0.0\n"
MANY = ("[world]\nmeans = [" + ", ".join(f"{x:.3f}" for x in np.linspace(-5, 5, 100)) + "]\nstds = 0.25\n\n"
        "[world.rewards.r]\nedges = [" + ", ".join(f"{x:.4f}" for x in np.linspace(-6, 6, 9999)) + "]\n"
        "values = [" + ", ".join("01"[i % 2] for i in range(10000)) + "]\n")
TOO_MUCH = {
    "means ±1e5": (WIDE.format(m=-1e5, M=1e5), "3.96e+08 quadrature points"),
    "means ±3e3": (WIDE.format(m=-3e3, M=3e3), "1.19e+07 quadrature points"),
    "means ±1e308": (WIDE.format(m=-1e308, M=1e308), "[world] means must lie within ±1e+06, got -1e+308"),
    "std 1e-300": ("[world]\nmeans = [-1.0, 1.0]\nstds = 1e-300\n\n[world.rewards.r]\nthreshold = 0.0\n",
                   "[world] stds must be from 1e-06 to 1e+06, got 1e-300"),
    "edge 1e308": ("[world]\nmeans = [-1.0, 1.0]\nstds = 0.5\n\n[world.rewards.r]\nedges = [0.0, 1e308]\n"
                   "values = [0, 1, 2]\n", "[world.rewards.r] edges must lie within ±1e+06, got 1e+308"),
    "cell 1e308": ("[world]\nmeans = [-1.0, 1.0]\nstds = 0.5\n\n[world.rewards.r]\ncell = 1e308\npattern = [0, 1]\n",
                   "[world.rewards.r] cell and phase must lie within ±1e+06"),
    "100 components × 10⁴ cells": (MANY, "100 components × (1e+04 cells + 8)"),
}


@pytest.mark.parametrize("case", sorted(TOO_MUCH))
def test_a_world_whose_work_or_numbers_are_too_large_is_one_line_before_any_work(tmp_path, case):
    text, needle = TOO_MUCH[case]
    path = setting(tmp_path, text, '["r"]', kind="gmm1d")
    refused(tmp_path, ["check-setting", path], needle)
    refused(tmp_path, ["estimate", "--policy", path, "--rewards", "r", "--exact", "--out", tmp_path / "x.parquet"],
            needle)


def test_the_work_limit_message_names_the_numbers_and_the_limit(tmp_path):
    path = setting(tmp_path, WIDE.format(m=-3e3, M=3e3), '["r"]', kind="gmm1d")
    line = invoke("check-setting", path).stderr.strip()
    assert f"at most {MAX_LEVEL_WORK:g} per noise level" in line and "2.38e+08 evaluations" in line
    assert "by 0.0005" in line and "2 components" in line


def test_the_whole_exact_table_is_bounded_too(tmp_path):
    refused(tmp_path, ["estimate", "--policy", "gmm1d", "--rewards", "coarse,mid,fine,fine_wide", "--exact",
                       "--steps", "10000", "--out", tmp_path / "x.parquet"], "use fewer --steps, rewards or α")


def test_the_predicted_work_is_what_the_quadrature_does():
    """The grid exact_work counts is the one the quadrature builds, and the enumerated cells cover every
    cell the posterior can reach (an upper bound within a few cells)."""
    for name in DEFAULT_WORLD.reward_names:
        for sigma in (0.04, 0.5, 1.0):
            points, cells, _ = DEFAULT_WORLD.exact_work(name, np.array([sigma]))
            lo, hi = (float(end[0]) for end in DEFAULT_WORLD.quadrature_span(np.array([sigma])))
            x = np.arange(lo, hi + world1d.QUAD_STEP, world1d.QUAD_STEP)
            assert len(x) <= points[0] <= len(x) + 1
            _, _, post_mean, post_std = DEFAULT_WORLD.posterior(x, sigma)
            reward = DEFAULT_WORLD.reward(name)
            reached = reward.count_cells(post_mean.min() - 12 * post_std.max(), post_mean.max() + 12 * post_std.max())
            assert reached <= cells[0] <= reached + 2  # the bound's range holds the grid's last point


def test_the_quadrature_in_chunks_is_the_quadrature_whole(monkeypatch):
    def curve():
        return [DEFAULT_WORLD.exact_discriminability("mid", s, a, BETA) for s in (0.1, 0.6) for a in (1.0, 2.0)]

    whole = curve()
    monkeypatch.setattr(world1d, "QUAD_CHUNK", 4 * 997)  # 997 points a chunk, the last one short
    np.testing.assert_allclose(curve(), whole, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------- finding 16: the real cause, named


@pytest.mark.parametrize("value", ["1000", "1e300"])
def test_reward_values_too_large_for_beta_are_named_as_such(tmp_path, value):
    path = setting(tmp_path, RARE.replace("threshold = 2.7", "threshold = 0.0").replace("100", value), TWO,
                   kind="gmm1d")
    needle = "[world.rewards.r] values reach"
    for args in (["check-setting", path],
                 ["estimate", "--policy", path, "--rewards", "r", "--exact", "--out", tmp_path / "x.parquet"],
                 ["estimate", "--policy", path, "--rewards", "r", "--n", "4", "--k", "1", "--p", "1",
                  "--out", tmp_path / "s.parquet"]):
        refused(tmp_path, args, needle)
    assert "too large for β = 0.5" in invoke("check-setting", path).stderr


def test_a_beta_too_small_for_the_rewards_is_named_before_any_nan(tmp_path):
    refused(tmp_path, ["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--exact", "--beta", "0.001",
                       "--steps", "3", "--out", tmp_path / "x.parquet"],
            "reward 'coarse' of gmm1d: values reach 1, too large for β = 0.001")
    scores = np.zeros((2, 3, 4, 2, 1))
    scores[:, :, :, :, 0] = 1e300
    with pytest.raises(BadInput, match="too large for β = 0.5 and α = 2: the log-weights"):
        estimate_gains(scores, ("r",), alpha=2.0, beta=0.5, standardise=False, bootstrap=0)


def test_an_alpha_too_large_is_named_before_any_nan(tmp_path):
    needle = f"must be positive numbers, at most {MAX_ALPHA:g}"
    refused(tmp_path, ["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--exact", "--alpha", "1e308",
                       "--out", tmp_path / "x.parquet"], "--alpha " + needle)
    path = setting(tmp_path, "", '["coarse", "fine"]')  # flow1d on the default world
    path.write_text(path.read_text() + '\n[study]\nbudgets = [[1, 1]]\nalpha = 1e308\ngains = "exact"\n')
    refused(tmp_path, ["check-setting", path], "[study] alpha " + needle)
    with pytest.raises(BadInput, match=needle):  # `recast study` computes its exact table through this call
        exact_table(EstimateConfig(policy="gmm1d", rewards=("coarse",), steps=3), GainOptions(alphas=(1e308,)),
                    tmp_path / "x.parquet")


def test_the_largest_alpha_on_the_rarest_cell_is_finite_and_exact():
    """α = MAX_ALPHA on finding 7's world: (h/Z)^α is e^{27000}, summed in the log domain."""
    world = rare_world()
    levels = np.array([0.0, 100.0])
    p_top = world.positive_acceptance("r") - np.exp(-100 / BETA)  # the top cell's mass
    p = np.array([1 - p_top, p_top])
    log_ratio = levels / BETA - logsumexp(levels / BETA, b=p)
    closed = logsumexp(MAX_ALPHA * log_ratio, b=p) / (MAX_ALPHA - 1)
    assert world.exact_discriminability("r", 0.0, MAX_ALPHA, BETA) == pytest.approx(closed, rel=1e-9)
    assert np.isfinite(world.exact_discriminability("r", 0.3, MAX_ALPHA, BETA))


def test_a_static_arm_on_an_overflowing_world_is_refused_as_the_setting_is_read(tmp_path):
    path = setting(tmp_path, WIDE.format(m=-1e308, M=1e308), '["r"]')
    refused(tmp_path, ["train", "--setting", path, "--weights", "static", "--out", tmp_path / "run"],
            "[world] means must lie within ±1e+06")

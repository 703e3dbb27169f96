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

from recast_cli.artifacts import read_gains
from recast_cli.errors import BadInput
from recast_cli.estimate.config import MAX_ALPHA, EstimateConfig, GainOptions
from recast_cli.estimate.gains import estimate_gains
from recast_cli.estimate.stage import exact_table
from recast_cli.policy import step_reward, world1d, world_limits
from recast_cli.policy.step_reward import StepReward
from recast_cli.policy.world1d import BETA, DEFAULT_WORLD, MIN_ACCEPTANCE, World1D
from recast_cli.policy.world_limits import MAX_LEVEL_WORK
from recast_cli.setting.load import load_setting
from recast_cli.preflight.check import check_setting
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
    assert "exact estimate ≤ 1.06e+06 evaluations per noise level (limit 1e+08)" in rows["[world]"]
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
    "100 components × 10⁴ cells": (MANY, "100 components × (1e+04 cells + 1 levels + 8)"),
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
    assert f"at most {MAX_LEVEL_WORK:g} per noise level" in line and "2.62e+08 evaluations" in line
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
            x = np.arange(lo, hi + world_limits.QUAD_STEP, world_limits.QUAD_STEP)
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


#: A pattern of 10⁴ distinct values on unit cells of the default mixture: a few of them near the means, so
#: its cells are few (about 16 per noise level) while its levels are many.
MANY_VALUES = World1D(DEFAULT_WORLD.weights, DEFAULT_WORLD.means, DEFAULT_WORLD.stds,
                      (("many", StepReward(cell=1.0, values=tuple(i / 10000 for i in range(10000)))),))
#: A coarser quadrature step for the tests below (exact_work reads world1d's QUAD_STEP, the quadrature is given it).
TEST_STEP = 5e-3
#: The default rewards: one level above the lowest, on 2 to 60 cells.
DEFAULT_CASES = [(DEFAULT_WORLD, name) for name in DEFAULT_WORLD.reward_names]
#: 37 levels on half-cells repeating every 30: the even cells' 30 values each hold one cell, about half of
#: them near the posteriors, the odd cells' 7 values several (fewer levels than MANY_VALUES: the reference
#: below sums every level at every point).
SOME_VALUES = World1D(DEFAULT_WORLD.weights, DEFAULT_WORLD.means, DEFAULT_WORLD.stds,
                      (("some", StepReward(cell=0.5, values=tuple((i % 7) / 3 if i % 2 else 3 + i / 100
                                                                   for i in range(60)))),))


def test_the_predicted_work_counts_what_the_quadrature_computes(monkeypatch):
    """The work exact_work predicts is the work the quadrature does, within a factor of 2.5, counted as the
    [points, components] elements of every cell's mass and every level's sum: a periodic pattern of 10⁴
    values is not 10⁴ sums per point (it was: 7.8 s predicted as 2.8e6, the default ``fine`` 0.22 s
    predicted as 8.5e6). The estimate counts every cell enumerated, the quadrature only those of the
    levels above the lowest (half of ``fine``'s), hence the factor."""
    counted = [0]
    mass, held = step_reward._mass, StepReward.held_probabilities

    def counting_mass(lo, hi, mean, std, safe):
        counted[0] += mean.size
        return mass(lo, hi, mean, std, safe)

    def counting_held(reward, mean, std, levels):
        for i, p in held(reward, mean, std, levels):
            counted[0] += p.size
            yield i, p

    monkeypatch.setattr(step_reward, "_mass", counting_mass)
    monkeypatch.setattr(StepReward, "held_probabilities", counting_held)
    monkeypatch.setattr(world1d, "QUAD_STEP", TEST_STEP)
    for world, name in [(MANY_VALUES, "many"), *DEFAULT_CASES]:
        for sigma in (0.04, 0.5, 1.0):
            points, _, work = world.exact_work(name, np.array([sigma]))
            counted[0] = 0
            world.exact_discriminability(name, sigma, 2.0, BETA, quad_step=TEST_STEP)
            predicted = work[0] - points[0] * len(world.means) * world_limits.POSTERIOR_COST
            assert counted[0] <= predicted <= 2.5 * counted[0], (name, sigma, counted[0], predicted)


def level_probability(reward: StepReward, mean: np.ndarray, std: np.ndarray, level: float) -> np.ndarray:
    """P(r = level) under N(mean, std²) [N, J], straightforwardly: its cells' masses summed from zeros, left
    to right, among every cell within 12 stds of the means (all of them, for explicit cells)."""
    reach = (mean.min() - 12 * std.max(), mean.max() + 12 * std.max())
    total = np.zeros(mean.shape)
    for lo, hi, value in reward.cells(*reach):
        if value == level:
            total = total + step_reward._mass(lo, hi, mean, std, std)
    return total


def straightforward_d(world: World1D, name: str, sigma: float, alpha: float) -> float:
    """E4 as the quadrature did before it skipped any level: every level's probability at every point,
    in one chunk (a reference for the skipping code, which must agree to the last bit)."""
    reward = world.reward(name)
    levels = reward.levels
    lifts = [np.expm1((u - levels[0]) / BETA) for u in levels[1:]]
    z = 1.0 + sum(lift * float(world.w @ level_probability(reward, world.mu, world.s, u))
                  for lift, u in zip(lifts, levels[1:]))
    lo, hi = (float(end[0]) for end in world.quadrature_span(np.array([sigma])))
    x = np.arange(lo, hi + TEST_STEP, TEST_STEP)
    log_marginal, post_w, post_mean, post_std = world.posterior(x, sigma)
    h = 1.0 + sum(lift * (post_w * level_probability(reward, post_mean, post_std, u)).sum(axis=1)
                  for lift, u in zip(lifts, levels[1:]))
    part = world1d._renyi_part(h / z, np.exp(log_marginal) * TEST_STEP, alpha)
    return part if alpha == 1.0 else float(logsumexp([part]) / (alpha - 1.0))


@pytest.mark.parametrize("name", ["some", *DEFAULT_WORLD.reward_names])
def test_skipping_the_levels_without_cells_changes_no_bit(name):
    """The exact D equals the straightforward quadrature to the last bit, with levels skipped (``some``) and
    without (the default rewards; test_world_setting checks their whole table at the full step against the
    shipped example)."""
    world = SOME_VALUES if name == "some" else DEFAULT_WORLD
    for sigma in (0.04, 0.5, 1.0):
        for alpha in (1.0, 2.0):
            assert world.exact_discriminability(name, sigma, alpha, BETA, quad_step=TEST_STEP) == \
                straightforward_d(world, name, sigma, alpha), (name, sigma, alpha)


# ---------------------------------------------------------------------- finding 16: the real cause, named


@pytest.mark.parametrize("value", ["1000", "1e300"])
def test_reward_values_too_large_for_beta_are_named_as_such(tmp_path, value):
    path = setting(tmp_path, RARE.replace("threshold = 2.7", "threshold = 0.0").replace("100", value), TWO,
                   kind="gmm1d")
    needle = f"[world.rewards.r] values span 0 to {float(value):g}, too wide for β = 0.5"
    for args in (["check-setting", path],
                 ["estimate", "--policy", path, "--rewards", "r", "--exact", "--out", tmp_path / "x.parquet"],
                 ["estimate", "--policy", path, "--rewards", "r", "--n", "4", "--k", "1", "--p", "1",
                  "--out", tmp_path / "s.parquet"]):
        refused(tmp_path, args, needle)


def test_a_beta_too_small_for_the_rewards_is_named_before_any_nan(tmp_path):
    refused(tmp_path, ["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--exact", "--beta", "0.001",
                       "--steps", "3", "--out", tmp_path / "x.parquet"],
            "reward 'coarse' of gmm1d: values span 0 to 1, too wide for β = 0.001")
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


# ---------------------------------------------------------------------- the tilt is the values' spread

#: One threshold twice: as 0/1, and as 200/201 (refused while the bound was |r|/β ≤ 350, though every exp
#: of a value over β is taken relative to another value).
SHIFTED = ("[world]\nmeans = [-1.0, 1.0]\nstds = 0.25\n\n[world.rewards.a]\nthreshold = 0.3\n\n"
           "[world.rewards.b]\nthreshold = 0.3\nbelow = 200\nabove = 201\n")


def test_values_far_from_zero_tilt_as_their_spread_does(tmp_path):
    path = setting(tmp_path, SHIFTED, '["a", "b"]', kind="gmm1d")
    check = invoke("check-setting", path)
    assert check.exit_code == 0, check.stderr
    out = tmp_path / "exact.parquet"
    result = invoke("estimate", "--policy", path, "--rewards", "a,b", "--exact", "--steps", "4", "--out", out)
    assert result.exit_code == 0, (result.stderr, result.exception)
    table = read_gains(out)
    assert table.rewards == ("a", "b") and np.array_equal(table.D[0], table.D[1]) and table.D[0, 0] > 0
    world = load_setting(str(path)).policy.world
    assert np.array_equal(world.sample_positive("a", 500, seed=1, beta=BETA),
                          world.sample_positive("b", 500, seed=1, beta=BETA))
    assert world.positive_acceptance("a") == world.positive_acceptance("b")


SPREADS = {
    "(-175, 175), the widest before": ("below = -175\nabove = 175", None),
    "(0, 351)": ("below = 0\nabove = 351", "[world.rewards.a] values span 0 to 351, too wide for β = 0.5: the tilt "
                 "exp((r − r_min)/β) reaches e^702 and overflows float64; keep (r_max − r_min)/β <= 700"),
    "(1e7, 1e7 + 1)": ("below = 1e7\nabove = 10000001",
                       "[world.rewards.a] values must lie within ±1e+06, got 10000000.0"),
}


@pytest.mark.parametrize("case", sorted(SPREADS))
def test_a_spread_too_wide_for_beta_or_a_value_too_large_is_one_line(tmp_path, case):
    values, needle = SPREADS[case]
    path = setting(tmp_path, f"[world]\nmeans = [-1.0, 1.0]\nstds = 0.25\n\n[world.rewards.a]\nthreshold = 0.0\n"
                             f"{values}\n\n[world.rewards.s]\nthreshold = 0.0\n", '["a", "s"]', kind="gmm1d")
    if needle is None:
        check = invoke("check-setting", path)
        assert check.exit_code == 0, check.stderr
    else:
        refused(tmp_path, ["check-setting", path], needle)


def test_the_pold_kl_is_shifted_so_a_wide_reward_spread_cannot_overflow():
    """E8 at α = 1 (mean_n ĥ log ĥ / Ẑ − log Ẑ) equals its unshifted form where that is finite, and stays
    finite where exp(ĥ − log Ẑ) alone would overflow (log-weights 700 apart: the widest spread a world allows)."""
    from scipy.special import logsumexp

    from recast_cli.estimate.gains import discriminability_pold

    lh = np.random.default_rng(0).normal(size=(3, 16, 5, 2))
    log_z = logsumexp(lh[:, :, 0], axis=1) - np.log(16)
    plain = np.mean(np.exp(lh - log_z[:, None, None, :]) * lh, axis=1) - log_z[:, None, :]
    assert np.allclose(discriminability_pold(lh, 1.0), plain, rtol=0, atol=1e-12)
    wide = np.zeros((1, 64, 3, 1))
    wide[0, :32] = 700.0  # half the draws at the top value: D = KL = log 2 at every step
    assert np.allclose(discriminability_pold(wide, 1.0), np.log(2), rtol=0, atol=1e-9)  # 700 − 699.3: round-off of 700

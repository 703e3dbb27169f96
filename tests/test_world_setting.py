"""``[world]``: the analytic world written in a setting (issue 33 §2, docs/settings.md "[world]").

Today's world is one such definition (its exact table to the bit, the shipped example to 1e-12);
the shorthands mean what the docs say; a world of its own has its own exact curves, samples,
posterior, velocity and training rewards; every bad definition is one line and exit 2.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from recast_cli.artifacts import read_gains
from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.policy.gmm1d import GMM1DPolicy, GMM1DReward, exact_gain_table
from recast_cli.policy.step_reward import StepReward
from recast_cli.policy.world1d import DEFAULT_WORLD, World1D
from recast_cli.policy.world_table import world_from_table
from recast_cli.setting.load import load_setting

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "pipelines" / "examples" / "gmm1d-exact-alpha2.parquet"

TODAY = """
[world]
weights = [0.25, 0.25, 0.25, 0.25]
means = [-2.4, -1.6, 1.6, 2.4]
stds = 0.25

[world.rewards.coarse]
threshold = 0.0

[world.rewards.mid]
edges = [-2.0, 2.0]
values = [1, 0, 1]

[world.rewards.fine]
cell = 0.2
pattern = [0, 1]

[world.rewards.fine_wide]
cell = 0.3
pattern = [0, 1]
"""

#: Four unequal components; a coarse split (threshold), a mid-scale band (intervals: the inner
#: modes against the outer), a fine shifted comb (periodic cells) and a non-binary reward.
CUSTOM = """
[world]
weights = [0.1, 0.3, 0.4, 0.2]
means = [-2.0, -1.2, 1.0, 2.2]
stds = [0.2, 0.3, 0.25, 0.35]

[world.rewards.side]
threshold = 0.0

[world.rewards.band]
intervals = [[-1.6, 1.6]]

[world.rewards.ripple]
cell = 0.15
pattern = [0, 1]
phase = 0.05

[world.rewards.tiers]
edges = [-1.6, 0.0, 1.6]
values = [0, 0.25, 0.5, 1]
"""

FLOW1D = """
[policy]
kind = "{kind}"
steps = 6
noise_level = 0.7
{world}
[train]
rewards = {rewards}
lambda = [1, 1]
prompts = "prompts.txt"
train_fraction = 1.0
lora_rank = 0
max_steps = 1
group_size = 4
prompts_per_step = 4
micro_batch = 96
sample_batch = 16
learning_rate = 3e-3
beta_kl = 0.0
save_every = 1

[evaluate]
n = 256
seed = 10000
batch_size = 256
judges = []
"""


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def setting(tmp_path: Path, world: str, rewards: str = '["side", "ripple"]', kind: str = "flow1d",
            name: str = "world.toml") -> Path:
    (tmp_path / "prompts.txt").write_text("x\n")
    path = tmp_path / name
    path.write_text(FLOW1D.format(kind=kind, world=world, rewards=rewards))
    return path


@pytest.fixture(scope="module")
def custom() -> World1D:
    return world_from_table(tomllib.loads(CUSTOM)["world"])


# ---------------------------------------------------------------------- today's world is one definition


def test_todays_world_written_out_is_the_default_world_and_its_exact_table_to_the_bit(tmp_path):
    path = setting(tmp_path, TODAY, '["coarse", "fine"]')
    assert load_setting(str(path)).policy.world == DEFAULT_WORLD
    out = tmp_path / "exact.parquet"
    result = invoke("estimate", "--policy", path, "--rewards", "coarse,mid,fine", "--exact", "--steps", "25",
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    written, shipped, constants = read_gains(out), read_gains(EXAMPLE), exact_gain_table(steps=25, alpha=2.0)
    assert written.rewards == shipped.rewards == ("coarse", "mid", "fine")
    np.testing.assert_allclose(written.D, shipped.D, rtol=0, atol=1e-12)
    np.testing.assert_allclose(written.D, constants.D, rtol=0, atol=1e-12)
    assert np.array_equal(written.D, constants.D)  # the same arithmetic: equal to the last bit
    assert written.meta["policy"] == constants.meta["policy"] == {"name": "gmm1d", "means": [-2.4, -1.6, 1.6, 2.4],
                                                                   "std": 0.25}


def test_the_documented_examples_parse_and_the_first_is_todays_world():
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / "settings.md").read_text(), re.S)
    worlds = [world_from_table(tomllib.loads(b)["world"]) for b in blocks if "[world]" in b]
    assert len(worlds) == 2 and worlds[0] == DEFAULT_WORLD and worlds[1] != DEFAULT_WORLD


def test_the_default_worlds_rewards_are_the_documented_indicators():
    x = np.array([-2.5, -2.0, -1.9, -0.1, 0.1, 0.3, 1.99, 2.1])
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("coarse", x), x > 0)
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("mid", x), np.abs(x) > 2)
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("fine", x), np.floor(x / 0.2) % 2 == 1)
    np.testing.assert_array_equal(DEFAULT_WORLD.reward_value("fine_wide", x), np.floor(x / 0.3) % 2 == 1)


# ---------------------------------------------------------------------- the shorthands


def test_shorthands_are_their_explicit_cells():
    def reward(**table):
        return world_from_table({"means": [0.0], "stds": 1.0, "rewards": {"r": table}}).reward("r")

    assert reward(threshold=0.5) == StepReward(edges=(0.5,), values=(0.0, 1.0))
    assert reward(threshold=0.5, below=2, above=-1) == StepReward(edges=(0.5,), values=(2.0, -1.0))
    assert reward(intervals=[[-1, 0], [0.5, 2]]) == StepReward(edges=(-1.0, 0.0, 0.5, 2.0),
                                                               values=(0.0, 1.0, 0.0, 1.0, 0.0))
    assert reward(intervals=[[-1, 0]], inside=3, outside=1) == StepReward(edges=(-1.0, 0.0), values=(1.0, 3.0, 1.0))
    comb = reward(cell=0.25, pattern=[0, 1, 3], phase=0.1)
    x = np.linspace(-3, 3, 2001)
    k = np.floor((x - 0.1) / 0.25).astype(int)
    np.testing.assert_array_equal(comb.value(x), np.array([0.0, 1.0, 3.0])[k % 3])
    # a point on an edge belongs to the cell on its right
    assert reward(edges=[0.0, 1.0], values=[5, 6, 7]).value(np.array([0.0, 1.0, -1e-300])).tolist() == [6, 7, 5]


@pytest.mark.parametrize("name", ["side", "band", "ripple", "tiers"])
def test_the_probability_of_each_level_is_the_gaussian_mass_of_its_cells(custom, name):
    """P(r = v) under N(m, s²) against a fine Riemann sum of the density over r = v, and the
    point mass at s = 0."""
    reward = custom.reward(name)
    mean, std = np.array([-1.3, 0.02, 1.7]), np.array([0.4, 0.05, 0.0])
    grid = np.linspace(-6, 6, 1_200_001)
    values = reward.value(grid)
    total = np.zeros(3)
    for level in reward.levels:
        p = custom.reward_probability(name, mean, std, level)
        for i in range(2):
            dens = stats.norm.pdf(grid, mean[i], std[i]) * (values == level)
            assert abs(p[i] - dens.sum() * (grid[1] - grid[0])) < 2e-4  # a Riemann sum over the jumps
        assert p[2] == float(reward.value(mean[2:])[0] == level)
        total += p
    np.testing.assert_allclose(total, 1.0, atol=1e-12)


# ---------------------------------------------------------------------- a world of its own


def test_a_custom_world_has_its_own_exact_table_through_the_cli(tmp_path, custom):
    """Three rewards at three scales: the split peaks at the noisy end, the band mid-way, the comb
    at the clean end — and the table is not today's."""
    path = setting(tmp_path, CUSTOM)
    out = tmp_path / "exact.parquet"
    result = invoke("estimate", "--policy", path, "--rewards", "side,band,ripple", "--exact", "--steps", "25",
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    table = read_gains(out)
    assert table.rewards == ("side", "band", "ripple") and table.meta["sampling"] == "exact"
    assert table.peak_step().tolist() == [16, 8, 1]
    assert (np.diff(table.D, axis=1) <= 1e-12).all() and np.abs(table.D[:, -1]).max() < 1e-9
    assert (table.D[:, 0] > 0.2).all()
    assert table.meta["policy"] == {"name": "gmm1d", "world": custom.describe()}
    assert table.provenance.config["setting"] == str(path)
    today = read_gains(EXAMPLE)
    assert table.peak_step().tolist() != today.peak_step().tolist()
    assert np.abs(table.D[:, 0] - today.D[:, 0]).max() > 0.05


def test_a_non_binary_reward_matches_the_closed_form_at_the_data_level(custom):
    """At σ = 0, h = exp(r/β): D_2 = log(E[e^{2r/β}] / E[e^{r/β}]²) with P(r = v) from the cells."""
    beta = 0.5
    levels = np.array(custom.reward_levels("tiers"))
    p = np.array([float(custom.w @ custom.reward_probability("tiers", custom.mu, custom.s, u)) for u in levels])
    assert levels.tolist() == [0, 0.25, 0.5, 1] and abs(p.sum() - 1) < 1e-12
    closed = np.log((p * np.exp(2 * levels / beta)).sum() / (p * np.exp(levels / beta)).sum() ** 2)
    assert abs(custom.exact_discriminability("tiers", 0.0, alpha=2.0, beta=beta) - closed) < 1e-12
    assert abs(custom.exact_discriminability("tiers", 1e-4, alpha=2.0, beta=beta) - closed) < 1e-3
    assert abs(custom.exact_discriminability("tiers", 1.0, alpha=2.0, beta=beta)) < 1e-9


def test_samples_cdfs_and_rollouts_follow_the_custom_world(custom):
    x = custom.sample_old(6000, seed=1)
    assert stats.kstest(x, custom.old_cdf).pvalue > 1e-3
    assert stats.kstest(x, DEFAULT_WORLD.old_cdf).pvalue < 1e-6  # the test can fail
    for name in ("band", "tiers"):
        plus = custom.sample_positive(name, 4000, seed=2, beta=0.5)
        assert stats.kstest(plus, lambda v, n=name: custom.positive_cdf(n, v, 0.5)).pvalue > 1e-3
    assert stats.kstest(custom.sample_positive("band", 4000, seed=2, beta=0.5), custom.old_cdf).pvalue < 1e-6
    policy = GMM1DPolicy(steps=25, world=custom)
    n, x_t, t = 3000, 0.4, 12
    x0 = policy.rollout(torch.full((n, 1), x_t, dtype=torch.float64), torch.full((n,), t), None, 1.0,
                        torch.arange(n)).numpy()[:, 0]
    assert stats.kstest(x0, lambda v: custom.posterior_cdf(v, x_t, float(policy.sigmas[t]))).pvalue > 1e-3


def test_the_velocity_is_exact_in_numpy_and_torch_for_any_batch_shape(custom):
    """v = (x − E[x_0 | x_σ])/σ: against the posterior mean by quadrature of π^old·N(x; (1−σ)x_0, σ²),
    the same numbers in torch for a [3, 4, 5] batch, and the policy's velocity."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, (3, 4, 5))
    sigma = rng.uniform(0, 1, (3, 4, 5))
    sigma[0, 0] = 0.0
    v = custom.velocity(x, sigma)
    assert v.shape == (3, 4, 5) and np.array_equal(v[0, 0], -x[0, 0])
    grid = np.linspace(-6, 6, 240_001)
    old = (custom.w * stats.norm.pdf(grid[:, None], custom.mu, custom.s)).sum(-1)
    for i, j, k in [(1, 2, 3), (2, 0, 4), (0, 3, 1)]:
        like = old * stats.norm.pdf(x[i, j, k], (1 - sigma[i, j, k]) * grid, sigma[i, j, k])
        x0_hat = (grid * like).sum() / like.sum()
        assert abs(v[i, j, k] - (x[i, j, k] - x0_hat) / sigma[i, j, k]) < 1e-6
    vt = custom.velocity_torch(torch.from_numpy(x), torch.from_numpy(sigma))
    assert vt.shape == (3, 4, 5) and vt.dtype == torch.float64
    np.testing.assert_allclose(vt.numpy(), v, rtol=1e-10, atol=1e-10)
    scalar = custom.velocity_torch(torch.from_numpy(x), 0.3)
    np.testing.assert_allclose(scalar.numpy(), custom.velocity(x, 0.3), rtol=1e-10, atol=1e-10)
    policy = GMM1DPolicy(steps=25, world=custom)
    flat = torch.from_numpy(x.reshape(-1, 1))
    np.testing.assert_array_equal(policy.velocity(flat, torch.from_numpy(sigma.reshape(-1)), None).numpy(),
                                  v.reshape(-1, 1))
    # reward values: numpy and torch, any shape, the same numbers
    for name in custom.reward_names:
        a = custom.reward_value(name, x)
        b = custom.reward_value(name, torch.from_numpy(x).to(torch.float32).to(torch.float64))
        assert a.shape == (3, 4, 5) and np.array_equal(a, b.numpy())
    assert np.isnan(custom.reward_value("ripple", np.array([np.nan]))[0])


def test_the_one_level_torch_velocity_is_the_numpy_velocity(custom):
    """One σ for the whole batch (a number or a one-element tensor: the batched engine's sampling and
    evaluation) takes its own path: the same numbers as numpy at every level of the grid, −x at σ = 0,
    and finite far outside the mixture, where every component's density underflows."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 2, 501), [-60.0, 45.0, 0.0]]).reshape(3, -1, 1)
    for sigma in np.linspace(0, 1, 26):
        want = custom.velocity(x, sigma)
        for level in (float(sigma), torch.tensor(sigma), torch.tensor([sigma])):
            got = custom.velocity_torch(torch.from_numpy(x), level)
            assert got.shape == x.shape and torch.isfinite(got).all()
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    assert torch.equal(custom.velocity_torch(torch.from_numpy(x), 0.0), -torch.from_numpy(x))


def test_a_flow1d_setting_trains_evaluates_and_estimates_on_its_world(tmp_path, custom):
    path = setting(tmp_path, CUSTOM)
    spec = load_setting(str(path)).policy
    assert spec.world == custom
    check = invoke("check-setting", path)
    assert check.exit_code == 0, check.stderr
    assert "side (2 cells)" in check.stdout and "ripple" in check.stdout
    run = tmp_path / "run"
    result = invoke("train", "--setting", path, "--weights", "static", "--out", run, "--quiet")
    assert result.exit_code == 0, (result.stderr, result.exception)
    import pandas as pd

    metrics = pd.read_parquet(run / "metrics.parquet")
    assert set(metrics["reward"]) == {"side", "ripple"} and np.all(np.isfinite(metrics["loss"]))
    from recast_cli.artifacts import read_curve
    from recast_cli.policy.flow1d import Flow1DPolicy

    base = tmp_path / "base.parquet"
    result = invoke("evaluate", "--setting", path, "--sampler", "sde", "--n", "512", "--out", base, "--quiet")
    assert result.exit_code == 0, result.stderr
    curve = read_curve(base)
    flow = Flow1DPolicy(6, world=custom)
    x0 = flow.sample(flow.encode_prompts(["x"] * 512), 0.7, torch.arange(512) + 10000).states[:, -1]
    direct = [GMM1DReward(r, custom).score(x0, ["x"] * 512).mean() for r in ("side", "ripple")]
    assert curve.value(0, "sde", "side") == pytest.approx(direct[0], abs=1e-12)
    assert curve.value(0, "sde", "ripple") == pytest.approx(direct[1], abs=1e-12)
    assert abs(direct[0] - custom.w[2:].sum()) < 0.1  # side = 1{x >= 0}: the two right components' weight
    out = tmp_path / "sampled.parquet"
    result = invoke("estimate", "--policy", path, "--rewards", "side,tiers", "--n", "16", "--k", "1", "--p", "1",
                    "--steps", "6", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert read_gains(out).rewards == ("side", "tiers")
    # a reward the world does not define is refused before any work, by name
    wrong = setting(tmp_path, CUSTOM, '["side", "coarse"]', name="wrong.toml")
    for args in (["train", "--setting", wrong, "--weights", "static", "--out", tmp_path / "r2"],
                 ["estimate", "--policy", path, "--rewards", "side,fine", "--exact", "--out", tmp_path / "x.parquet"],
                 ["check-setting", wrong]):
        bad = invoke(*args)
        assert bad.exit_code == 2 and "has no reward" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r2").exists() and not (tmp_path / "x.parquet").exists()


def test_the_study_graph_takes_the_exact_curves_of_the_settings_world(tmp_path):
    from recast_cli.study.spec import load_study
    from recast_cli.study.makefile import analytic_study_makefile

    study = ('\n[study]\nbudgets = [[1, 1]]\nseeds = [0]\nmodes = ["static"]\ngains = "exact"\n'
             'estimate_steps = 6\nn = 16\nk = 1\np = 1\n')
    for world, policy in ((CUSTOM, None), ("", "gmm1d")):
        path = setting(tmp_path, world, '["side", "ripple"]' if world else '["coarse", "fine"]',
                       name=f"s{len(world)}.toml")
        path.write_text(path.read_text() + study)
        loaded = load_setting(str(path))
        graph = analytic_study_makefile(loaded, load_study(loaded), tmp_path / "R")
        expected = policy or re.escape(str(path))
        assert re.search(rf"estimate --policy {expected} --rewards \S+ --exact", graph), graph


# ---------------------------------------------------------------------- bad definitions

GOOD_MIXTURE = "[world]\nmeans = [-1.0, 1.0]\nstds = 0.5\n"
GOOD_REWARD = "\n[world.rewards.r]\nthreshold = 0.0\n"

BAD = {
    "unsorted edges": (GOOD_MIXTURE + "\n[world.rewards.r]\nedges = [1.0, 0.0]\nvalues = [0, 1, 0]\n",
                       "[world.rewards.r] edges must be strictly increasing"),
    "duplicate edges": (GOOD_MIXTURE + "\n[world.rewards.r]\nedges = [0.0, 0.0]\nvalues = [0, 1, 0]\n",
                        "edges must be strictly increasing (sorted, no repeats), got [0, 0]"),
    "values length": (GOOD_MIXTURE + "\n[world.rewards.r]\nedges = [0.0]\nvalues = [0, 1, 0]\n",
                      "needs one value per cell, len(edges) + 1 = 2; got 3 values"),
    "weights sum": ("[world]\nweights = [0.5, 0.4]\nmeans = [-1.0, 1.0]\nstds = 0.5\n" + GOOD_REWARD,
                    "[world] weights sum to 0.9, not 1"),
    "negative weight": ("[world]\nweights = [1.5, -0.5]\nmeans = [-1.0, 1.0]\nstds = 0.5\n" + GOOD_REWARD,
                        "[world] weights must be > 0, got -0.5"),
    "zero std": ("[world]\nmeans = [-1.0, 1.0]\nstds = [0.5, 0.0]\n" + GOOD_REWARD, "[world] stds must be > 0"),
    "negative std": ("[world]\nmeans = [-1.0, 1.0]\nstds = -0.5\n" + GOOD_REWARD, "[world] stds must be > 0"),
    "mixture lengths": ("[world]\nmeans = [-1.0, 1.0]\nstds = [0.5, 0.5, 0.5]\n" + GOOD_REWARD,
                        "one entry per component: 2, 2 and 3 given"),
    "infinite mean": ("[world]\nmeans = [-1.0, inf]\nstds = 0.5\n" + GOOD_REWARD,
                      "world.means[1] = inf is not a finite number"),
    "nan value": (GOOD_MIXTURE + "\n[world.rewards.r]\nedges = [0.0]\nvalues = [0, nan]\n",
                  "world.rewards.r.values[1] = nan is not a finite number"),
    "text mean": ('[world]\nmeans = [-1.0, "one"]\nstds = 0.5\n' + GOOD_REWARD,
                  "[world] means[1] = 'one' is not a number"),
    "all values equal": (GOOD_MIXTURE + "\n[world.rewards.r]\nedges = [0.0]\nvalues = [1, 1]\n",
                         "[world.rewards.r] is constant on the support"),
    "constant on the support": (GOOD_MIXTURE + "\n[world.rewards.r]\nthreshold = 9.0\n",
                                "every cell π^old gives mass >= 1e-12 holds 0.0"),
    "too many cells": (GOOD_MIXTURE + "\n[world.rewards.r]\ncell = 0.0001\npattern = [0, 1]\n",
                       "cells over the support [-7, 7] (π^old's means ± 12 stds); at most 10000"),
    "zero cell": (GOOD_MIXTURE + "\n[world.rewards.r]\ncell = 0.0\npattern = [0, 1]\n", "needs cell > 0"),
    "unknown world key": (GOOD_MIXTURE + "mean = 0.0\n" + GOOD_REWARD, "[world]: unknown key 'mean'"),
    "unknown reward key": (GOOD_MIXTURE + "\n[world.rewards.r]\nthreshold = 0.0\nvalues = [0, 1]\n",
                           "[world.rewards.r]: unknown key 'values'; a threshold reward takes threshold, below, above"),
    "two forms": (GOOD_MIXTURE + "\n[world.rewards.r]\nthreshold = 0.0\ncell = 0.2\n",
                  "takes exactly one of edges, threshold, intervals, cell; got threshold and cell"),
    "no form": (GOOD_MIXTURE + "\n[world.rewards.r]\nvalues = [0, 1]\n", "got none of them"),
    "overlapping intervals": (GOOD_MIXTURE + "\n[world.rewards.r]\nintervals = [[-1.0, 0.5], [0.0, 1.0]]\n",
                              "intervals must be increasing and disjoint"),
    "no rewards": (GOOD_MIXTURE, "[world] defines no reward"),
    "no means": ("[world]\nstds = 0.5\n" + GOOD_REWARD, "[world] needs means"),
    "duplicate reward": (GOOD_MIXTURE + GOOD_REWARD + GOOD_REWARD, "not valid TOML"),
    "clashing name": (GOOD_MIXTURE + "\n[world.rewards.clip]\nthreshold = 0.0\n",
                      "'clip' is the name of another scorer"),
    "reserved name": (GOOD_MIXTURE + "\n[world.rewards.aggregate]\nthreshold = 0.0\n",
                      "'aggregate' is the name of another scorer"),
    "bad name": (GOOD_MIXTURE + '\n[world.rewards."Fine Cells"]\nthreshold = 0.0\n',
                 "a reward name is lower-case letters"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_definition_is_one_line_and_exit_2(tmp_path, case):
    text, needle = BAD[case]
    path = setting(tmp_path, text, '["r", "s"]')
    for args in (["check-setting", path],
                 ["estimate", "--policy", path, "--rewards", "r", "--exact", "--steps", "3",
                  "--out", tmp_path / "x.parquet"]):
        result = invoke(*args)
        assert result.exit_code == 2, (case, result.stdout, result.stderr, result.exception)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and path.name in lines[0], lines
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_a_world_belongs_to_an_analytic_policy_only(tmp_path):
    path = tmp_path / "img.toml"
    path.write_text('[policy]\nkind = "sd3"\npath = "m"\n' + GOOD_MIXTURE + GOOD_REWARD)
    result = invoke("check-setting", path)
    assert result.exit_code == 2 and "[world] defines an analytic world; a sd3 policy has none" in result.stderr
    with pytest.raises(BadInput, match="weights sum to"):  # a world built in code is checked too
        World1D(weights=(0.5, 0.6), means=(0.0, 1.0), stds=(1.0, 1.0),
                rewards=(("r", StepReward(edges=(0.0,), values=(0.0, 1.0))),))
    with pytest.raises(BadInput, match="the \\[world\\] of x has no reward 'nope'; it has side"):
        world_from_table(tomllib.loads(CUSTOM)["world"], label="the [world] of x").reward("nope")


def test_the_batched_study_runs_a_custom_world_as_its_single_runs(tmp_path):
    """``recast study`` on a setting with a [world]: its exact gains are the world's, and the seed's
    cell equals ``recast train`` + ``recast evaluate`` on the same setting (v* and rewards of the world)."""
    from recast_cli.artifacts import read_cell, read_curve

    path = setting(tmp_path, CUSTOM)
    path.write_text(path.read_text().replace("max_steps = 1", "max_steps = 2").replace("save_every = 1",
                                                                                       "save_every = 2")
                    + '\n[study]\nbudgets = [[1, 2]]\nseeds = [0, 1]\nmodes = ["recast"]\ngains = "exact"\n'
                      'estimate_steps = 6\n')
    out = tmp_path / "st"
    result = invoke("study", path, "--out", out, "--seeds", "0,1", "--no-report", "--quiet")
    assert result.exit_code == 0, result.output
    exact = read_gains(out / "gains" / "exact.parquet")
    assert exact.rewards == ("side", "ripple") and "world" in exact.meta["policy"]
    cell = read_cell(out / "cells" / "1-2-recast-g4.parquet")
    run = tmp_path / "run"
    w = out / "W" / "1-2-recast.safetensors"
    assert invoke("train", "--setting", path, "--weights", w, "--seed", "0", "--lambda", "1,2", "--out", run,
                  "--quiet").exit_code == 0
    assert invoke("evaluate", "--run", run, "--checkpoints", "all", "--sampler", "sde", "--out",
                  tmp_path / "c.parquet", "--quiet").exit_code == 0
    mine, theirs = cell.curve(0), read_curve(tmp_path / "c.parquet")
    assert theirs.scorers == ("side", "ripple", "aggregate")
    for k, point in enumerate(theirs.points):
        np.testing.assert_allclose(mine.mean[mine.points.index(point)], theirs.mean[k], rtol=0, atol=1e-12)

"""`self`: sampling-importance-resampling from π^old matches π⁺ (E2) on the exact gmm1d world."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from scipy.stats import kstest, ks_2samp

from recast_cli.artifacts import read_positives
from recast_cli.errors import BadInput
from recast_cli.policy.world1d import DEFAULT_WORLD
from recast_cli.positives.sir import effective_sample_size, sir_resample, tilt_weights
from tests.positives.common import assert_one_line_exit_2, recast

POOL, N = 20_000, 3_000


def resampled(reward: str, beta: float, standardise: bool, seed: int = 0) -> np.ndarray:
    pool = DEFAULT_WORLD.sample_old(POOL, seed)
    rewards = DEFAULT_WORLD.reward_value(reward, pool)
    picks = sir_resample(rewards, N, beta, np.random.default_rng(seed + 1), standardise)
    return pool[picks]


@pytest.mark.parametrize("reward", ["coarse", "mid", "fine"])
def test_raw_tilt_resampling_matches_exact_positive_samples(reward):
    x = resampled(reward, DEFAULT_WORLD.beta, standardise=False)
    assert ks_2samp(x, DEFAULT_WORLD.sample_positive(reward, N, seed=5)).pvalue > 0.01
    assert kstest(x, lambda v: DEFAULT_WORLD.positive_cdf(reward, v)).pvalue > 0.01
    share = DEFAULT_WORLD.reward_value(reward, x).mean()  # π⁺ puts e²/(1 + e²) of its mass on r = 1
    assert abs(share - np.exp(2) / (1 + np.exp(2))) < 4 * np.sqrt(0.12 * 0.88 / N)


@pytest.mark.parametrize("reward", ["coarse", "mid"])
def test_standardised_tilt_at_beta_one_is_the_raw_tilt_at_one_half(reward):
    # P(r = 1) = 1/2 under π^old, so std r = 1/2 and exp(r̃/1) ∝ exp(r/0.5).
    x = resampled(reward, 1.0, standardise=True, seed=11)
    assert kstest(x, lambda v: DEFAULT_WORLD.positive_cdf(reward, v)).pvalue > 0.01


@pytest.mark.parametrize("reward", ["coarse", "mid"])
def test_uniform_resampling_is_told_apart_from_positive_samples(reward):
    x = resampled(reward, 1e9, standardise=False)  # no tilt: π^old, not π⁺
    assert kstest(x, lambda v: DEFAULT_WORLD.positive_cdf(reward, v)).pvalue < 1e-6


def test_weights_are_the_normalised_tilt():
    w = tilt_weights(np.array([0.0, 1.0, 1.0, 3.0]), beta=0.5, standardise=False)
    assert np.isclose(w.sum(), 1) and np.isclose(w[3] / w[0], np.exp(6)) and np.isclose(w[1], w[2])
    flat = tilt_weights(np.full(5, 2.0), beta=1.0)  # a constant reward carries no information
    assert np.allclose(flat, 0.2) and np.isclose(effective_sample_size(flat), 5)
    with pytest.raises(BadInput):
        tilt_weights(np.array([0.0, np.nan]), 1.0)
    with pytest.raises(BadInput):
        tilt_weights(np.array([0.0, 1.0]), 0.0)


def setting_file(tmp_path, model) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text(f'[policy]\nkind = "sd3"\npath = "{model}"\nsteps = 2\nresolution = 32\n'
                    'max_sequence_length = 1\nprecision = "no"\nnoise_level = 0.7\nprompt_check = "toy"\n')
    return str(path)


def test_self_writes_one_positive_set_per_reward_and_resumes(tmp_path, tiny_pipeline):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle on a white background\n")
    args = ["sample-positive", "--setting", setting_file(tmp_path, tiny_pipeline), "--prompts", prompts,
            "--source", "self", "--rewards", "toy_color,toy_shape", "--n", 3, "--draws", 4, "--batch", 4,
            "--device", "cpu", "--out", tmp_path / "out"]
    result = recast(*args)
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert positives.rewards() == ("toy_color", "toy_shape")
    for reward in positives.rewards():
        rows = positives.for_prompt(0, reward)
        assert [r.sample_id for r in rows] == [0, 1, 2]
        assert all(0 <= r.seed < 4 and f"/draw-{r.seed}-" in r.image_path for r in rows)
    with Image.open(tmp_path / "out" / positives.samples[0].image_path) as image:
        assert image.size == (32, 32)
    assert positives.meta["sir"]["draws"] == 4 and positives.meta["source"]["kind"] == "self"
    with pytest.raises(BadInput, match="per reward"):
        positives.for_prompt(0)
    again = recast(*args)
    assert again.exit_code == 0 and read_positives(tmp_path / "out").samples == positives.samples


def test_self_positives_record_their_tilt_scale_and_the_estimator_uses_it(tmp_path, tiny_pipeline):
    """The std of each reward over a prompt's S π^old draws is the scale r̃ = r/s of its tilt (E2);
    the gain table standardises by that recorded scale and says so."""
    from recast_cli.artifacts import read_gains, read_scores
    from recast_cli.estimate.stage import SCALE_SIR

    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle on a white background\n")
    setting = setting_file(tmp_path, tiny_pipeline)
    result = recast("sample-positive", "--setting", setting, "--prompts", prompts, "--source", "self",
                    "--rewards", "toy_color,toy_shape", "--n", 2, "--draws", 4, "--batch", 4, "--device", "cpu",
                    "--out", tmp_path / "pos")
    assert result.exit_code == 0, result.stderr
    rows = read_positives(tmp_path / "pos").samples
    scales = {r.reward: r.reward_std for r in rows}
    assert all(s is not None and s >= 0 for s in scales.values())
    assert len({(r.reward, r.reward_std) for r in rows}) == 2  # one scale per (prompt, reward)
    out = tmp_path / "g.parquet"
    result = recast("estimate", "--policy", setting, "--rewards", "toy_color,toy_shape", "--positives", tmp_path / "pos",
                    "--n", 2, "--k", 1, "--steps", 2, "--out", out)
    assert result.exit_code == 0, result.stderr
    meta = read_gains(out).meta
    assert meta["reward_std_source"] == SCALE_SIR
    expected = {r: (s if s > 0 else 1.0) for r, s in scales.items()}
    assert meta["reward_std_per_prompt"] == {"0": pytest.approx(expected)}
    # the π^old draws of this run (t = T) spread differently: it is the recorded scale that was used
    scores = read_scores(tmp_path / "g.scores.parquet").scores
    assert not np.allclose(scores[0, :, -1].reshape(-1, 2).std(axis=0), list(expected.values()))


def test_self_refuses_fewer_draws_than_positives(tmp_path, tiny_pipeline):
    result = recast("sample-positive", "--setting", setting_file(tmp_path, tiny_pipeline), "--source", "self",
                    "--rewards", "toy_color", "--n", 4, "--draws", 2, "--out", tmp_path / "out")
    assert_one_line_exit_2(result, "--draws (2) must be at least --n (4)")
    assert not (tmp_path / "out").exists()

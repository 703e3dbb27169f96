"""recast estimate on an SD3-architecture policy: renderer positives, positives folders (shared, per reward)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import PositiveSample, read_gains, read_scores, write_positives_manifest
from recast_cli.cli import app
from recast_cli.policy.sample import png_bytes
from tests.conftest import tiny_toy_setting
from recast_cli.toy.renderer import render

runner = CliRunner()
REWARDS = "toy_color,toy_shape,toy_sharpness"
PROMPTS = ["a red circle on a white background", "a blue square on a black background"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    return tiny_toy_setting(tmp_path_factory.mktemp("toy"), seed=2, steps=4)


def positives_folder(root, rewards=(None,), n=2):
    samples = []
    (root / "images").mkdir(parents=True)
    for pid, prompt in enumerate(PROMPTS):
        for reward in rewards:
            for i in range(n):
                data = png_bytes(render(prompt, seed=10 * pid + i))
                name = f"images/{pid}-{reward}-{i}.png"
                (root / name).write_bytes(data)
                samples.append(PositiveSample(pid, prompt, i if reward is None else i + 100 * rewards.index(reward),
                                              name, "renderer", 10 * pid + i, hashlib.sha256(data).hexdigest(), reward))
    write_positives_manifest(root, samples)
    return root


def estimate(setting, out, *extra):
    result = runner.invoke(app, ["estimate", "--policy", str(setting), "--rewards", REWARDS, "--steps", "4", "--n", "2",
                                 "--k", "2", "--bootstrap", "10", "--out", str(out), *extra])
    assert result.exit_code == 0, result.stderr
    return read_gains(out), read_scores(out.with_name(out.stem + ".scores.parquet"))


def test_toy_setting_uses_the_renderer_as_positives(setting, tmp_path):
    gains, scores = estimate(setting, tmp_path / "g.parquet", "--p", "2")
    assert gains.meta["positives"] == {"source": "renderer"}
    assert gains.meta["grid"] == {"kind": "flowmatch", "shift": 3.0, "num_train_timesteps": 1000}
    assert scores.scores.shape == (2, 2, 5, 2, 3)
    # t = 0 scores the (VAE round trip of the) renderer image itself; colour survives any autoencoder
    assert np.isfinite(scores.scores[:, :, 0, 0]).all()


def test_shared_and_per_reward_positive_folders(setting, tmp_path):
    shared = positives_folder(tmp_path / "shared")
    gains, _ = estimate(setting, tmp_path / "a.parquet", "--positives", str(shared))
    assert gains.meta["P"] == 2 and gains.meta["positives"]["source"] == str(shared)
    per_reward = positives_folder(tmp_path / "per", rewards=("toy_color", "toy_shape", "toy_sharpness"))
    gains, scores = estimate(setting, tmp_path / "b.parquet", "--positives", str(per_reward))
    assert scores.scores.shape == (2, 2, 5, 2, 3) and np.isfinite(scores.scores[:, :, 1:]).all()


def test_too_few_positives_is_bad_input(setting, tmp_path):
    folder = positives_folder(tmp_path / "few", n=1)
    result = runner.invoke(app, ["estimate", "--policy", str(setting), "--rewards", REWARDS, "--n", "2",
                                 "--positives", str(folder), "--out", str(tmp_path / "g.parquet")])
    assert result.exit_code == 2 and "fewer than N = 2" in result.stderr

"""`recast estimate --policy RUN` measures the trained policy: the run's setting with its checkpoint's LoRA.

The cheapest estimate that works on the tiny setting: π⁺-sampling with the toy renderer's
positives (no files to prepare), T = 4, N = 2, K = 2, P = 1, 10 bootstrap resamples.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_gains, read_scores, sha256_file
from recast_cli.cli import app
from recast_cli.estimate.worlds import resolve_policy
from tests.train.conftest import tiny_train_setting

runner = CliRunner()
REWARDS = "toy_color,toy_shape,toy_sharpness"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate-ckpt")
    setting = tiny_train_setting(root)
    run = root / "run"
    result = runner.invoke(app, ["train", "--setting", str(setting), "--weights", "static", "--out", str(run),
                                 "--max-steps", "1", "--set", "save_every=1", "--lr", "0.05", "--device", "cpu",
                                 "--quiet"])
    assert result.exit_code == 0, result.stderr
    return setting, run


def estimate(policy, out):
    result = runner.invoke(app, ["estimate", "--policy", str(policy), "--rewards", REWARDS, "--steps", "4",
                                 "--n", "2", "--k", "2", "--p", "1", "--bootstrap", "10", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return read_gains(out), read_scores(out.with_name(out.stem + ".scores.parquet"))


@pytest.fixture(scope="module")
def base(trained, tmp_path_factory):
    return estimate(trained[0], tmp_path_factory.mktemp("base") / "g.parquet")


@pytest.fixture(scope="module")
def from_run(trained, tmp_path_factory):
    return estimate(trained[1], tmp_path_factory.mktemp("run") / "g.parquet")


def test_a_run_folder_is_estimated_with_its_latest_checkpoint(trained, base, from_run):
    setting, run = trained
    checkpoint = run / "checkpoints" / "step-000001"
    adapter = checkpoint / "adapter" / "pytorch_lora_weights.safetensors"
    gains, scores = from_run
    info = gains.meta["policy"]
    assert info["checkpoint"] == str(checkpoint) and info["adapter"] == str(adapter)
    assert info["adapter_sha256"] == sha256_file(adapter)
    assert info["setting"] == str(setting) and info["weights_sha256"] == base[0].meta["policy"]["weights_sha256"]
    assert scores.meta["policy"] == info
    provenance = json.dumps(scores.meta)  # the scores table's sources name the adapter too (via write_scores)
    assert "adapter_sha256" in provenance
    _, base_scores = base
    assert scores.scores.shape == base_scores.scores.shape == (1, 2, 5, 2, 3)
    # same seeds and positives: t = 0 scores the positives themselves, the rollouts (t ≥ 1) differ by the LoRA
    np.testing.assert_array_equal(scores.scores[:, :, 0], base_scores.scores[:, :, 0])
    assert not np.array_equal(scores.scores[:, :, 1:], base_scores.scores[:, :, 1:])
    assert np.isfinite(scores.scores[:, :, 1:]).all() and np.isfinite(scores.scores[:, :, 0, 0]).all()
    assert scores.meta["run_id"] != base_scores.meta["run_id"]


def test_a_checkpoint_folder_is_the_same_policy(trained):
    setting, run = trained
    checkpoint = run / "checkpoints" / "step-000001"
    assert resolve_policy(str(checkpoint)) == (str(setting), checkpoint)
    assert resolve_policy(str(run)) == (str(setting), checkpoint)
    assert resolve_policy(str(setting)) == (str(setting), None)
    assert resolve_policy("gmm1d") == ("gmm1d", None)


def test_a_checkpoint_folder_estimates_like_its_run(trained, from_run, tmp_path):
    _, run = trained
    a = from_run[1]
    b = estimate(run / "checkpoints" / "step-000001", tmp_path / "b.parquet")[1]
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.meta["policy"] == b.meta["policy"]


def test_a_folder_that_is_no_setting_run_or_checkpoint_is_bad_input(trained, tmp_path):
    _, run = trained
    for folder in (tmp_path, run / "checkpoints", run / "checkpoints" / "step-000001" / "adapter"):
        result = runner.invoke(app, ["estimate", "--policy", str(folder), "--rewards", REWARDS, "--steps", "4",
                                     "--n", "2", "--k", "2", "--p", "1", "--out", str(tmp_path / "g.parquet")])
        assert result.exit_code == 2, result.stderr
        assert "neither a recast train run" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "g.parquet").exists() and not (tmp_path / "g.scores.parquet").exists()


def test_a_run_without_a_checkpoint_is_bad_input(trained, tmp_path):
    _, run = trained
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "run.json").write_text((run / "run.json").read_text())
    result = runner.invoke(app, ["estimate", "--policy", str(empty), "--rewards", REWARDS, "--steps", "4",
                                 "--n", "2", "--k", "2", "--p", "1", "--out", str(tmp_path / "g.parquet")])
    assert result.exit_code == 2 and "no complete checkpoint" in result.stderr

"""recast estimate / merge through the CLI: shards, resume, --from-scores, --exact, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_gains, read_scores
from recast_cli.cli import app

runner = CliRunner()
BASE = ["estimate", "--policy", "gmm1d", "--rewards", "coarse,mid,fine", "--n", "40", "--k", "2", "--p", "4",
        "--bootstrap", "20"]


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "g.parquet"
    run(*BASE, "--out", out)
    return out


def test_scores_and_gains_are_written_with_run_metadata(single):
    gains = read_gains(single)
    scores = read_scores(single.with_name("g.scores.parquet"))
    assert gains.rewards == ("coarse", "mid", "fine") and gains.T == 25
    assert gains.meta["sampling"] == "pplus" and gains.meta["crn"] is True and gains.meta["rollout_noise"] == 1.414
    assert set(gains.meta["surrogate_check"]) == {"coarse", "mid", "fine"}
    assert scores.scores.shape == (4, 40, 26, 2, 3)
    assert gains.D_lo is not None and gains.meta["run_id"] == scores.meta["run_id"]


def test_from_scores_recomputes_without_rollouts_and_sweeps_alpha(single, tmp_path):
    scores = single.with_name("g.scores.parquet")
    run("estimate", "--from-scores", scores, "--alpha", "2", "--bootstrap", "20", "--out", tmp_path / "again.parquet")
    a, b = read_gains(single), read_gains(tmp_path / "again.parquet")
    np.testing.assert_array_equal(a.D, b.D)
    np.testing.assert_array_equal(a.gain, b.gain)
    run("estimate", "--from-scores", scores, "--alpha", "0.5,4", "--monotone", "clip", "--out", tmp_path / "s.parquet")
    for alpha in ("0.5", "4"):
        table = read_gains(tmp_path / f"s-alpha{alpha}.parquet")
        assert table.meta["alpha"] == float(alpha) and table.meta["monotone"] == "clip"


def test_outputs_that_are_inputs_are_refused(single, tmp_path):
    import hashlib
    import shutil

    scores = tmp_path / "g.scores.parquet"
    shutil.copy(single.with_name("g.scores.parquet"), scores)
    before = hashlib.sha256(scores.read_bytes()).hexdigest()
    for args in (["estimate", "--from-scores", scores, "--out", scores],
                 ["merge", scores, "--out", tmp_path / "g.parquet"]):  # merge writes OUT.scores.parquet = the shard
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 2 and "it is also an input of this command" in result.stderr, result.stderr
    assert hashlib.sha256(scores.read_bytes()).hexdigest() == before


def test_two_shards_merged_equal_a_single_run(single, tmp_path):
    for i in range(2):
        run(*BASE, "--shard", f"{i}/2", "--out", tmp_path / f"s{i}.parquet")
    run("merge", tmp_path / "s0.scores.parquet", tmp_path / "s1.scores.parquet", "--bootstrap", "20",
        "--out", tmp_path / "merged.parquet")
    np.testing.assert_array_equal(read_scores(tmp_path / "merged.scores.parquet").scores,
                                  read_scores(single.with_name("g.scores.parquet")).scores)
    a, b = read_gains(single), read_gains(tmp_path / "merged.parquet")
    for name in ("D", "gain", "gain_raw", "D_lo", "D_hi", "gain_lo", "gain_hi"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_a_killed_run_resumes_to_the_identical_table(single, tmp_path, monkeypatch):
    from recast_cli.estimate import rollouts

    real = rollouts.prompt_scores
    calls = {"n": 0}

    def dies_on_third_prompt(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr("recast_cli.estimate.stage.prompt_scores", dies_on_third_prompt)
    out = tmp_path / "g.parquet"
    assert runner.invoke(app, [*BASE, "--out", str(out)]).exit_code != 0
    assert not out.exists() and len(list((tmp_path / "g.parquet.parts").glob("prompt-*.safetensors"))) == 2
    monkeypatch.setattr("recast_cli.estimate.stage.prompt_scores", real)
    resumed = run(*BASE, "--out", out)
    assert "resuming: 2 of 4 prompts already done" in resumed.stderr
    np.testing.assert_array_equal(read_gains(out).D, read_gains(single).D)
    assert not (tmp_path / "g.parquet.parts").exists()


def test_exact_writes_the_exact_table_in_the_same_schema(tmp_path):
    run("estimate", "--policy", "gmm1d", "--rewards", "coarse,mid,fine", "--alpha", "2", "--steps", "25", "--exact",
        "--out", tmp_path / "exact.parquet")
    table = read_gains(tmp_path / "exact.parquet")
    assert table.peak_step().tolist() == [18, 7, 2]
    np.testing.assert_allclose(table.D[:, 0], 0.45744109, atol=5e-9)


BAD = {
    "unknown reward": (["--policy", "gmm1d", "--rewards", "coarse,sharp"], "no reward 'sharp'"),
    "unknown scorer": (["--policy", "toy", "--rewards", "toy_colour"], "unknown reward 'toy_colour'"),
    "K < 1": (["--policy", "gmm1d", "--rewards", "coarse", "--k", "0"], "--k must be an integer from 1 to 10000"),
    "alpha <= 0": (["--policy", "gmm1d", "--rewards", "coarse", "--alpha", "0"], "--alpha must be positive"),
    "beta <= 0": (["--policy", "gmm1d", "--rewards", "coarse", "--beta", "-1"], "--beta must be positive"),
    "T < 1": (["--policy", "gmm1d", "--rewards", "coarse", "--steps", "0"],
              "--steps must be an integer from 1 to 10000, got 0"),
    "bad shard": (["--policy", "gmm1d", "--rewards", "coarse", "--shard", "2/2"], "need 0 <= i < n"),
    "shard text": (["--policy", "gmm1d", "--rewards", "coarse", "--shard", "half"], "expected i/n"),
    "missing positives": (["--policy", "gmm1d", "--rewards", "coarse", "--positives", "nowhere"], "takes no --positives"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, case):
    args, needle = BAD[case]
    out = tmp_path / "g.parquet"
    result = runner.invoke(app, ["estimate", *args, "--out", str(out)])
    assert result.exit_code == 2, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_from_scores_of_another_schema_and_foreign_merges(single, tmp_path):
    result = runner.invoke(app, ["estimate", "--from-scores", str(single), "--out", str(tmp_path / "x.parquet")])
    assert result.exit_code == 2 and "schema tag is 'recast.gains/2'" in result.stderr
    other = tmp_path / "other.parquet"
    run(*BASE[:-2], "--bootstrap", "0", "--seed", "9", "--shard", "1/2", "--out", other)
    result = runner.invoke(app, ["merge", str(single.with_name("g.scores.parquet")),
                                 str(tmp_path / "other.scores.parquet"), "--out", str(tmp_path / "m.parquet")])
    assert result.exit_code == 2 and "different runs" in result.stderr
    result = runner.invoke(app, ["merge", str(single.with_name("g.scores.parquet")),
                                 str(single.with_name("g.scores.parquet")), "--out", str(tmp_path / "m.parquet")])
    assert result.exit_code == 2 and "in another shard too" in result.stderr


def test_accelerate_launch_with_two_cpu_processes_equals_a_single_run(single, tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        accelerate = Path(shutil.which("accelerate") or "accelerate")
    out = tmp_path / "g.parquet"
    cmd = [str(accelerate), "launch", "--num_processes", "2", "--cpu", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "-m", "recast_cli", *BASE, "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("wrote") == 2  # only the main process writes
    np.testing.assert_array_equal(read_scores(out.with_name("g.scores.parquet")).scores,
                                  read_scores(single.with_name("g.scores.parquet")).scores)
    a, b = read_gains(single), read_gains(out)
    for name in ("D", "gain", "D_lo", "D_hi"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_inspect_reads_scores_tables_and_positives_folders(single, tmp_path):
    import json as _json

    scores = single.with_name("g.scores.parquet")
    summary = _json.loads(runner.invoke(app, ["inspect", str(scores), "--json"]).stdout)
    assert summary["schema"] == "recast.scores/1" and summary["kind"] == "scores"
    assert [r["reward"] for r in summary["rewards"]] == ["coarse", "mid", "fine"]
    assert 0 <= summary["rewards"][0]["mean_rollouts"] <= 1
    assert "mean raw score" in runner.invoke(app, ["inspect", str(scores)]).stdout
    result = runner.invoke(app, ["inspect", str(scores), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "is a scores artifact" in result.stderr
    run("sample-positive", "--setting", "toy", "--source", "renderer", "--n", "1", "--out", tmp_path / "pos")
    summary = _json.loads(runner.invoke(app, ["inspect", str(tmp_path / "pos"), "--json"]).stdout)
    assert summary["kind"] == "positives" and summary["prompts"] == 24 and summary["images"] == 24
    assert summary["sources"] == ["renderer"] and summary["reward_sets"] == []



def test_exact_reports_its_progress_on_stderr_not_stdout(tmp_path):
    result = runner.invoke(app, ["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--exact", "--steps", "5",
                                 "--out", str(tmp_path / "e.parquet")])
    assert result.exit_code == 0 and "wrote" in result.stdout and "exact D" not in result.stdout
    bad = runner.invoke(app, ["estimate", "--policy", "gmm1d", "--rewards", "nope", "--exact", "--out",
                              str(tmp_path / "x.parquet")])
    assert bad.exit_code == 2 and "gmm1d has no reward 'nope'" in bad.stderr and not (tmp_path / "x.parquet").exists()

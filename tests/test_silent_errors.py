"""Silently wrong results and tracebacks, each now one line and exit 2 through the CLI (issue 30, items 5-7).

* non-finite floats: every float option, every setting value, every ``--set``;
* a training step whose loss, gradient norm, weights or sampled images go non-finite stops the run,
  and nothing of that step is checkpointed;
* ``merge`` of some shards of a run only (refused, or recorded with ``--allow-partial``);
* a reward named twice, refused before any rollout;
* a gain table with no row; a truncated part of a resumable run (named before any work);
* a full disk while writing (the old file kept, no temporary file left);
* a user's file in ``OUT.parts/`` survives the run that finishes there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_gains, read_scores
from recast_cli.cli import app
from recast_cli.train.trainer import Trainer
from tests.conftest import bump_gains, make_table
from tests.train.conftest import tiny_train_setting

runner = CliRunner()
GMM = ["estimate", "--policy", "gmm1d", "--rewards", "coarse,mid", "--n", "8", "--k", "2", "--p", "4", "--steps", "6",
       "--bootstrap", "0"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def run_ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def assert_bad(result, *needles: str) -> str:
    """Exit 2 and one line on stderr holding every needle; returns the line."""
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def gains(tmp_path) -> Path:
    from recast_cli.artifacts import write_gains

    path = tmp_path / "gains" / "g.parquet"
    path.parent.mkdir()
    write_gains(path, make_table(0.05 * bump_gains([5, 2], [2, 1], 6), ("coarse", "mid")), config={"test": True})
    return path


@pytest.fixture(scope="module")
def setting(tmp_path_factory) -> Path:
    return tiny_train_setting(tmp_path_factory.mktemp("tiny"))


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ item 5: every float finite


@pytest.mark.parametrize("args, option", [
    (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--beta", "inf"], "--beta inf"),
    (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--rollout-noise", "nan"], "--rollout-noise nan"),
    (["solve-w", "--gains", "G", "--lambda", "1,1", "--tau", "-inf"], "--tau -inf"),
    (["solve-w", "--gains", "G", "--lambda", "1,1", "--floor", "1e999"], "--floor inf"),
    (["sample", "--prompt", "a red circle on a white background", "--cfg", "nan"],
     "--cfg nan"),
])
def test_a_non_finite_float_option_is_refused_before_anything(tmp_path, gains, args, option):
    args = [gains if a == "G" else a for a in args]
    assert_bad(invoke(*args, "--out", tmp_path / "out" / "x.parquet"), option, "must be a finite number")
    assert not (tmp_path / "out").exists()


def test_a_non_finite_training_flag_is_refused(setting, tmp_path):
    assert_bad(invoke("train", "--setting", setting, "--weights", "static", "--out", tmp_path / "run", "--lr", "inf",
                      "--device", "cpu", "--quiet"), "--lr inf: must be a finite number")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("pair, needle", [
    ("learning_rate=inf", "--set learning_rate: learning_rate = inf is not a finite number"),
    ("beta_kl=nan", "--set beta_kl: beta_kl = nan is not a finite number"),
    ("grad_clip=1e400", "--set grad_clip: grad_clip = inf is not a finite number"),
    ("lambda=[1, inf, 1]", "--set lambda"),
])
def test_a_non_finite_set_value_is_refused(setting, tmp_path, pair, needle):
    assert_bad(invoke("train", "--setting", setting, "--weights", "static", "--out", tmp_path / "run", "--set", pair,
                      "--device", "cpu", "--quiet"), needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("table, key, value", [
    ("train", "weight_decay", "inf"), ("policy", "noise_level", "nan"), ("evaluate", "guidance_scale", "-inf"),
    ("rewards.toy_color", "scale", "inf"), ("study", "budgets", "[[1.0, nan, 1.0]]"),
])
def test_a_non_finite_setting_value_is_refused_naming_it(tmp_path, table, key, value):
    path = tiny_train_setting(tmp_path / "s")
    text = path.read_text()
    if f"[{table}]" in text:
        text = text.replace(f"[{table}]\n", f"[{table}]\n{key} = {value}\n")
    else:
        text += f"\n[{table}]\n{key} = {value}\n"
    path.write_text(text)
    where = f"{table}.{key}" + ("[0][1]" if table == "study" else "")
    shown = "nan" if "nan" in value else value.replace("[[1.0, ", "")
    for args in (["check-setting", path],
                 ["train", "--setting", path, "--weights", "static", "--out", tmp_path / "run", "--device", "cpu"]):
        assert_bad(invoke(*args), f"{path}: {where} = {shown} is not a finite number")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ item 5: a non-finite step stops training


def train(setting: Path, out: Path, *extra):
    return invoke("train", "--setting", setting, "--weights", "static", "--out", out, "--device", "cpu", "--quiet",
                  *extra)


def checkpoints(run: Path) -> list[str]:
    folder = run / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_learning_rate_that_overflows_the_weights_stops_at_step_1(setting, tmp_path):
    out = tmp_path / "run"
    line = assert_bad(train(setting, out, "--set", "learning_rate=1e300", "--set", "save_every=1"),
                      "training stopped at step 1: the updated weights became non-finite", "nothing of that step "
                      "was saved")
    assert "lower learning_rate" in line
    assert checkpoints(out) == [] and not (out / "metrics.parquet").exists()


def test_weights_blown_up_stop_the_next_step_whose_images_are_not_finite(setting, tmp_path):
    """lr = 1e30: step 1's weights are finite but huge; step 2 samples non-finite images and stops before
    scoring them; step 1's checkpoint stays, step 2 has none."""
    out = tmp_path / "run"
    assert_bad(train(setting, out, "--set", "learning_rate=1e30", "--set", "save_every=1"),
               "training stopped at step 2: the sampled images became non-finite")
    assert checkpoints(out) == ["step-000001"]
    import pandas as pd

    assert sorted(set(pd.read_parquet(out / "metrics.parquet")["step"])) == [1]


def test_a_non_finite_loss_stops_training_with_nothing_saved(setting, tmp_path, monkeypatch):
    real = Trainer.pair_loss

    def nan_loss(self, batch, adv_t, pairs):
        loss, parts = real(self, batch, adv_t, pairs)
        return loss * float("nan"), {**parts, "loss": float("nan")}

    monkeypatch.setattr(Trainer, "pair_loss", nan_loss)
    out = tmp_path / "run"
    assert_bad(train(setting, out, "--set", "save_every=1"), "training stopped at step 1: the loss became non-finite")
    assert checkpoints(out) == []


def test_a_non_finite_gradient_norm_stops_training(setting, tmp_path, monkeypatch):
    import accelerate
    import torch

    monkeypatch.setattr(accelerate.Accelerator, "clip_grad_norm_", lambda self, params, norm: torch.tensor(np.inf))
    out = tmp_path / "run"
    assert_bad(train(setting, out, "--set", "save_every=1"),
               "training stopped at step 1: the gradient norm became non-finite")
    assert checkpoints(out) == []


# ------------------------------------------------------------------ item 5: merge refuses missing shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    for i in range(2):
        run_ok(*GMM, "--shard", f"{i}/2", "--out", root / f"s{i}.parquet")
    return root


def test_merge_of_one_shard_of_two_is_refused_naming_it(shards, tmp_path):
    out = tmp_path / "m" / "merged.parquet"
    assert_bad(invoke("merge", shards / "s0.scores.parquet", "--out", out),
               "the shards hold 2 of the run's 4 prompts: shard 1/2 missing (2 prompts)", "--allow-partial")
    assert not out.parent.exists()


def test_merge_allow_partial_warns_and_records_what_is_missing(shards, tmp_path):
    out = tmp_path / "merged.parquet"
    result = run_ok("merge", shards / "s1.scores.parquet", "--allow-partial", "--out", out)
    assert "recast: warning: partial merge: 2 of the run's 4 prompts, shard 0/2 missing" in result.stderr
    partial = {"prompts": 2, "of": 4, "missing_prompts": 2, "missing_shards": ["0/2"]}
    assert read_gains(out).meta["partial"] == partial
    assert read_gains(out).meta["P"] == 2
    assert read_scores(tmp_path / "merged.scores.parquet").meta["partial"] == partial
    # the partial table merged with the missing shard is whole again: no 'partial' left
    whole = tmp_path / "whole.parquet"
    result = run_ok("merge", tmp_path / "merged.scores.parquet", shards / "s0.scores.parquet", "--out", whole)
    assert "warning" not in result.stderr
    assert "partial" not in read_gains(whole).meta and read_gains(whole).meta["P"] == 4


def test_merge_of_every_shard_records_nothing_partial(shards, tmp_path):
    out = tmp_path / "merged.parquet"
    result = run_ok("merge", shards / "s0.scores.parquet", shards / "s1.scores.parquet", "--out", out)
    assert "warning" not in result.stderr and "partial" not in read_gains(out).meta


# ------------------------------------------------------------------ item 6: a reward named twice


def no_rollouts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a rollout ran")

    monkeypatch.setattr("recast_cli.estimate.stage.prompt_scores", refuse)


@pytest.mark.parametrize("policy, rewards", [("toy", "toy_color,toy_color"), ("gmm1d", "coarse,mid,coarse")])
def test_estimate_refuses_a_reward_named_twice_before_any_rollout(tmp_path, monkeypatch, policy, rewards):
    no_rollouts(monkeypatch)
    twice = rewards.split(",")[0]
    assert_bad(invoke("estimate", "--policy", policy, "--rewards", rewards, "--out", tmp_path / "g.parquet"),
               f"--rewards names '{twice}' twice")
    assert list(tmp_path.iterdir()) == []


def test_score_refuses_a_scorer_named_twice(tmp_path):
    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(tmp_path / "a.png")
    assert_bad(invoke("score", "--rewards", "toy_color, toy_color", "--images", tmp_path / "a.png", "--prompt",
                      "a red circle on a white background", "--out", tmp_path / "s.parquet"),
               "--rewards names 'toy_color' twice")
    assert files(tmp_path) == ["a.png"]


def test_sample_positive_self_refuses_a_reward_named_twice(setting, tmp_path):
    (tmp_path / "p.txt").write_text("a red circle on a white background\n")
    assert_bad(invoke("sample-positive", "--source", "self", "--setting", setting, "--rewards", "toy_color,toy_color",
                      "--prompts", tmp_path / "p.txt", "--n", "2", "--out", tmp_path / "pos"),
               "--rewards must name distinct rewards")
    assert files(tmp_path) == ["p.txt"]


def test_judge_refuses_a_criterion_named_twice(tmp_path):
    (tmp_path / "pairs.csv").write_text("prompt,image_a,image_b\n")
    assert_bad(invoke("judge", "--pairs", tmp_path / "pairs.csv", "--url", "http://127.0.0.1:9/v1", "--model", "m",
                      "--criteria", "aesthetics,Aesthetics", "--out", tmp_path / "j.parquet"),
               "--criteria names 'aesthetics' twice")
    assert files(tmp_path) == ["pairs.csv"]


def test_evaluate_refuses_a_judge_named_twice(setting, tmp_path):
    assert_bad(invoke("evaluate", "--setting", setting, "--judges", "toy_color", "--out", tmp_path / "E.parquet",
                      "--device", "cpu"), "scorer 'toy_color' is named twice")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("table, key", [("positives", "rewards"), ("evaluate", "judges")])
def test_a_setting_that_names_a_reward_twice_is_refused(tmp_path, table, key):
    path = tiny_train_setting(tmp_path)
    path.write_text(path.read_text() + f'\n[{table}]\n{key} = ["toy_color", "toy_shape", "toy_color"]\n')
    assert_bad(invoke("check-setting", path), f"[{table}]: {key} names 'toy_color' twice")


# ------------------------------------------------------------------ item 7: a gain table of no row


def test_a_gain_table_with_no_row_is_one_line_everywhere(gains, tmp_path):
    table = pq.read_table(gains)
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0).replace_schema_metadata(table.schema.metadata), empty)
    needle = f"{empty}: the table holds no row"
    assert_bad(invoke("solve-w", "--gains", empty, "--lambda", "1,1", "--out", tmp_path / "W.safetensors"), needle)
    assert_bad(invoke("inspect", empty), needle)
    assert_bad(invoke("compare-gains", gains, empty), needle)
    assert_bad(invoke("compare-gains", empty, gains), needle)
    assert not (tmp_path / "W.safetensors").exists()


# ------------------------------------------------------------------ item 7: a damaged part is named before any work


def killed_after_two_prompts(monkeypatch, out: Path) -> Path:
    from recast_cli.estimate import stage

    real = stage.prompt_scores
    calls = {"n": 0}

    def dies_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stage, "prompt_scores", dies_on_third)
    assert invoke(*GMM, "--out", out).exit_code != 0
    monkeypatch.setattr(stage, "prompt_scores", real)
    parts = out.with_name(out.name + ".parts")
    assert sorted(p.name for p in parts.glob("prompt-*")) == ["prompt-000000.safetensors", "prompt-000001.safetensors"]
    return parts


@pytest.mark.parametrize("damage, why", [
    (lambda p: p.write_bytes(p.read_bytes()[:-40]), "not a readable safetensors file"),
    (lambda p: p.write_bytes(b""), "not a readable safetensors file"),
    (lambda p: __import__("safetensors.numpy").numpy.save_file({"scores": np.zeros((2, 2))}, p),
     "it holds 'scores' of shape (2, 2), this run needs shape (8, 7, 2, 2)"),
])
def test_a_damaged_estimate_part_is_named_before_any_rollout(tmp_path, monkeypatch, damage, why):
    out = tmp_path / "g.parquet"
    parts = killed_after_two_prompts(monkeypatch, out)
    bad = parts / "prompt-000001.safetensors"
    damage(bad)
    no_rollouts(monkeypatch)
    assert_bad(invoke(*GMM, "--out", out), f"{bad}: a finished part of this run cannot be used ({why}",
               "delete that file to recompute it")
    assert not out.exists() and bad.is_file()
    monkeypatch.undo()
    bad.unlink()  # as the line says: the deleted prompt is recomputed, the other part reused
    run_ok(*GMM, "--out", out)
    assert read_gains(out).meta["P"] == 4 and not parts.exists()


def test_a_damaged_evaluate_chunk_is_named_before_any_sampling(tmp_path, monkeypatch):
    from recast_cli.evaluate import stage

    setting = tiny_train_setting(tmp_path / "s")
    (tmp_path / "s" / "held.txt").write_text("a red circle on a white background\n"
                                             "a blue square on a black background\n")
    setting.write_text(setting.read_text() + '\n[evaluate]\nprompts = "held.txt"\nn = 2\nsteps = 2\nbatch_size = 2\n')
    out = tmp_path / "E.parquet"
    real = stage.score_chunk
    calls = {"n": 0}

    def dies_on_second(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(stage, "score_chunk", dies_on_second)
    args = ["evaluate", "--setting", setting, "--out", out, "--device", "cpu", "--quiet"]
    assert invoke(*args).exit_code != 0
    chunk = stage.parts_dir(out) / "chunk-000000.json"
    chunk.write_text(chunk.read_text()[:25])

    def refuse(*a):
        raise AssertionError("sampled")

    monkeypatch.setattr(stage, "sample_chunk", refuse)
    assert_bad(invoke(*args), f"{chunk}: a finished part of this run cannot be used (not readable JSON")
    assert chunk.is_file() and not out.exists()


# ------------------------------------------------------------------ item 7: a full disk


@pytest.mark.parametrize("where", ["write", "fsync"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_and_the_old_file_is_kept(gains, tmp_path, monkeypatch, where, code):
    out = tmp_path / "W.safetensors"
    run_ok("solve-w", "--gains", gains, "--lambda", "1,1", "--out", out)
    before = sha(out)

    def full(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    if where == "write":
        real = Path.write_bytes
        monkeypatch.setattr(Path, "write_bytes",
                            lambda self, data: full() if self.name.endswith(".tmp") else real(self, data))
    else:
        monkeypatch.setattr(os, "fsync", full)
    assert_bad(invoke("solve-w", "--gains", gains, "--lambda", "2,1", "--out", out),
               f"no space left writing {out}", "the old file is kept")
    assert sha(out) == before and files(tmp_path) == ["W.safetensors", "gains", "gains/g.parquet"]


def test_a_full_disk_on_a_new_output_writes_nothing(gains, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "new" / "W.safetensors"
    assert_bad(invoke("solve-w", "--gains", gains, "--lambda", "1,1", "--out", out),
               f"no space left writing {out} (No space left on device); nothing was written")
    assert files(tmp_path) == ["gains", "gains/g.parquet"]  # no temporary file, no folder made for it


# ------------------------------------------------------------------ OUT.parts/: only recast's own files removed


def test_a_users_file_in_the_parts_folder_survives_the_finished_run(tmp_path):
    out = tmp_path / "g.parquet"
    parts = out.with_name("g.parquet.parts")
    parts.mkdir()
    (parts / "notes.txt").write_text("mine")
    (parts / "old").mkdir()
    (parts / "old" / "prompt-000000.safetensors").write_text("mine too")  # not a part: parts are not in folders
    run_ok(*GMM, "--out", out)
    assert files(parts) == ["notes.txt", "old", "old/prompt-000000.safetensors"]
    assert (parts / "notes.txt").read_text() == "mine"
    json.dumps(read_gains(out).meta)  # the run itself finished normally

"""``recast train`` end to end through the CLI on the tiny toy setting (T = 4), and its bad input.

Every bad input must exit 2 with one line on stderr before anything is written: a new --out
folder is not created, an existing run folder is left byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_weights, write_gains
from recast_cli.cli import app
from recast_cli.grid import GridSpec
from recast_cli.train import checkpoint as ckpt
from recast_cli.train.params import LORA_FILE
from tests.conftest import bump_gains, make_table

runner = CliRunner()
REWARDS = ("toy_color", "toy_shape", "toy_sharpness")  # the tiny setting's [train] rewards, lambda 1,2,1
FLOWMATCH = GridSpec("flowmatch", shift=3.0)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def run_ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def train(setting: Path, weights, out: Path, *extra):
    return invoke("train", "--setting", setting, "--weights", weights, "--out", out, "--device", "cpu", "--quiet",
                  *extra)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_bad(result, needle: str):
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gains_25(tmp_path_factory) -> Path:
    """A gain table for the setting's rewards on a 25-step flowmatch (shift 3) grid."""
    path = tmp_path_factory.mktemp("gains") / "gains.parquet"
    write_gains(path, make_table(0.05 * bump_gains([20, 12, 4], [4, 3, 2], 25), REWARDS, grid=FLOWMATCH),
                config={"test": True})
    return path


def solve(gains: Path, out: Path, *extra, lam: str = "1,2,1") -> Path:
    run_ok("solve-w", "--gains", gains, "--lambda", lam, "--out", out, *extra)
    return out


@pytest.fixture(scope="module")
def static_run(train_setting, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("static") / "run"
    result = train(train_setting, "static", out)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return out


def test_static_run_writes_a_complete_run_folder(static_run):
    for name in ("run.json", "config.toml", "weights.safetensors", "metrics.parquet"):
        assert (static_run / name).is_file(), name
    record = json.loads((static_run / "run.json").read_text())
    assert record["mode"] == "static" and record["rewards"] == list(REWARDS) and record["lambda"] == [1.0, 2.0, 1.0]
    w = read_weights(static_run / "weights.safetensors")
    assert w.mode == "static" and w.T == 4 and w.trained_steps == (2, 3, 4)  # the trainer skips t = 1
    expected = np.repeat(np.array([[0.25], [0.5], [0.25]]) / 3, 4, axis=1)
    expected[:, 0] = 0.0
    np.testing.assert_allclose(w.W, expected, rtol=1e-15)
    assert record["config"]["trained_steps"] == [4, 3, 2]
    assert "max_steps = 4" in (static_run / "config.toml").read_text()

    metrics = pd.read_parquet(static_run / "metrics.parquet")
    assert len(metrics) == 4 * len(REWARDS)
    assert not metrics.duplicated(["step", "reward"]).any()
    assert sorted(set(zip(metrics["step"], metrics["reward"]))) == sorted((s, r) for s in (1, 2, 3, 4) for r in REWARDS)
    assert np.all(np.isfinite(metrics["loss"])) and (metrics["images"] == 4).all()

    assert [s for s, _ in ckpt.list_checkpoints(static_run)] == [2, 4]
    for step in (2, 4):
        folder = static_run / "checkpoints" / f"step-{step:06d}"
        _, state = ckpt.read_checkpoint(folder)
        assert state["step"] == step and state["mode"] == "static"
        assert (folder / "adapter" / LORA_FILE).is_file()


def test_a_solve_w_matrix_on_the_samplers_grid_trains(train_setting, gains_25, tmp_path):
    w_path = solve(gains_25, tmp_path / "W.safetensors", "--steps", "4", "--grid", "flowmatch", "--shift", "3",
                   "--skip-clean", "1")
    assert read_weights(w_path).mode == "recast"
    out = tmp_path / "run"
    result = train(train_setting, w_path, out, "--max-steps", "1")
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    record = json.loads((out / "run.json").read_text())
    assert record["mode"] == "recast"
    copied = read_weights(out / "weights.safetensors")
    np.testing.assert_array_equal(copied.W, read_weights(w_path).W)
    _, state = ckpt.read_checkpoint(ckpt.step_dir(out, 1))
    assert state["mode"] == "recast" and state["step"] == 1


# ------------------------------------------------------------------ bad W files: exit 2, nothing written


def _gains_for(tmp_path: Path, rewards, grid=FLOWMATCH, steps: int = 25) -> Path:
    path = tmp_path / "g.parquet"
    write_gains(path, make_table(0.05 * bump_gains([steps * 0.8, steps * 0.5, steps * 0.2], [3, 2, 1], steps),
                                 tuple(rewards), grid=grid), config={"test": True})
    return path


@pytest.mark.parametrize("case, needle", [
    ("other_names", "is for rewards (a, b, c)"),
    ("other_order", "in that order"),
    ("other_T", "solve-w --steps 4"),
    ("other_grid", "another σ grid"),
    ("other_lambda", "was solved for lambda"),
])
def test_a_W_that_does_not_fit_the_run_is_refused(train_setting, gains_25, tmp_path, case, needle):
    w_path = tmp_path / "W.safetensors"
    fit = ("--steps", "4", "--grid", "flowmatch", "--shift", "3", "--skip-clean", "1")
    if case == "other_names":
        solve(_gains_for(tmp_path, ("a", "b", "c")), w_path, *fit)
    elif case == "other_order":
        solve(_gains_for(tmp_path, (REWARDS[1], REWARDS[0], REWARDS[2])), w_path, *fit)
    elif case == "other_T":
        solve(gains_25, w_path)
        assert read_weights(w_path).T == 25
    elif case == "other_grid":
        solve(gains_25, w_path, "--steps", "4", "--grid", "linear")
        assert read_weights(w_path).T == 4
    elif case == "other_lambda":
        solve(gains_25, w_path, *fit, lam="1,1,1")
    out = tmp_path / "run"
    result = train(train_setting, w_path, out)
    assert_bad(result, needle)
    assert not out.exists()
    if case == "other_T":
        assert "--grid flowmatch --shift 3" in result.stderr


@pytest.mark.parametrize("mode", ["recast", "nosink", "static"])
@pytest.mark.parametrize("skip, needle", [
    (0, "puts weight on step(s) [1], which the trainer does not train (it trains t = 2…4); "
        "solve it with --skip-clean 1"),
    (2, "gives trained step(s) [2] a zero column; solve it with --skip-clean 1"),
])
def test_a_W_off_the_trained_steps_is_refused_with_the_skip_clean_to_use(train_setting, gains_25, tmp_path, mode,
                                                                         skip, needle):
    """The tiny setting trains t = 4, 3, 2 (every step but the cleanest): W must live exactly there."""
    w_path = solve(gains_25, tmp_path / "W.safetensors", "--steps", "4", "--grid", "flowmatch", "--shift", "3",
                   "--mode", mode, "--skip-clean", str(skip))
    out = tmp_path / "run"
    assert_bad(train(train_setting, w_path, out), needle)
    assert not out.exists()


def test_train_fraction_one_needs_a_W_on_every_step(tmp_path, gains_25):
    from tests.train.conftest import tiny_train_setting

    setting = tiny_train_setting(tmp_path, "train_fraction = 1.0\n")
    fit = ("--steps", "4", "--grid", "flowmatch", "--shift", "3")
    skipping = solve(gains_25, tmp_path / "W1.safetensors", *fit, "--skip-clean", "1")
    assert_bad(train(setting, skipping, tmp_path / "run"), "gives trained step(s) [1] a zero column; "
                                                             "solve it with --skip-clean 0")
    every = solve(gains_25, tmp_path / "W0.safetensors", *fit)
    run_ok("train", "--setting", setting, "--weights", every, "--out", tmp_path / "ok", "--device", "cpu", "--quiet",
           "--max-steps", "1")
    assert json.loads((tmp_path / "ok" / "run.json").read_text())["config"]["trained_steps"] == [4, 3, 2, 1]


def test_W_is_checked_by_its_trained_steps_metadata_and_an_old_file_as_trained_everywhere(tmp_path, gains_25):
    """A W file from before ``trained_steps`` (no such metadata) trains every step: a run that trains
    all four takes it, the default run (which leaves t = 1 untrained) refuses it as it always did."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from tests.train.conftest import tiny_train_setting

    every = solve(gains_25, tmp_path / "W0.safetensors", "--steps", "4", "--grid", "flowmatch", "--shift", "3")
    with safe_open(str(every), framework="numpy") as fh:
        meta = {k: v for k, v in fh.metadata().items() if k != "trained_steps"}
    old = tmp_path / "old.safetensors"
    save_file(load_file(str(every)), str(old), metadata=meta)
    assert read_weights(old).trained_steps is None and read_weights(old).steps == (1, 2, 3, 4)
    setting = tiny_train_setting(tmp_path / "all", "train_fraction = 1.0\n")
    run_ok("train", "--setting", setting, "--weights", old, "--out", tmp_path / "ok", "--device", "cpu", "--quiet",
           "--max-steps", "1")
    assert json.loads((tmp_path / "ok" / "run.json").read_text())["config"]["trained_steps"] == [4, 3, 2, 1]
    default = tiny_train_setting(tmp_path / "default")
    assert_bad(train(default, old, tmp_path / "run"), "puts weight on step(s) [1], which the trainer does not train "
                                                      "(it trains t = 2…4); solve it with --skip-clean 1")


# ------------------------------------------------------------------ bad runs and options


def _copy_run(static_run: Path, dest: Path) -> Path:
    shutil.copytree(static_run, dest)
    return dest


def test_resume_from_a_corrupt_checkpoint_is_refused(train_setting, static_run, tmp_path):
    run = _copy_run(static_run, tmp_path / "run")
    adapter = ckpt.step_dir(run, 4) / "adapter" / LORA_FILE
    data = bytearray(adapter.read_bytes())
    for k in range(1, 9):
        data[-k * 7] ^= 0xFF
    adapter.write_bytes(bytes(data))
    before = snapshot(run)
    assert_bad(train(train_setting, "static", run, "--resume", "--max-steps", "6"), "corrupt")
    assert snapshot(run) == before


def test_resume_with_another_configuration_is_refused(train_setting, static_run, tmp_path):
    run = _copy_run(static_run, tmp_path / "run")
    before = snapshot(run)
    assert_bad(train(train_setting, "static", run, "--resume", "--max-steps", "6", "--lr", "5e-4"),
               "another configuration")
    assert snapshot(run) == before


def test_resume_with_another_W_is_refused(train_setting, static_run, gains_25, tmp_path):
    run = _copy_run(static_run, tmp_path / "run")
    w_path = solve(gains_25, tmp_path / "W.safetensors", "--steps", "4", "--grid", "flowmatch", "--shift", "3",
                   "--skip-clean", "1")
    before = snapshot(run)
    assert_bad(train(train_setting, w_path, run, "--resume", "--max-steps", "6"), "another W")
    assert snapshot(run) == before


def test_an_existing_run_without_resume_is_refused(train_setting, static_run):
    before = snapshot(static_run)
    assert_bad(train(train_setting, "static", static_run), "--resume")
    assert snapshot(static_run) == before


@pytest.mark.parametrize("case, needle", [
    ("empty", "--resume: {out} holds no recast run (no run.json)"),
    ("unrelated", "--resume: {out} holds no recast run (no run.json)"),
    ("fake run.json", "is not a recast.run/1 record"),
])
def test_resume_refuses_a_folder_that_is_not_a_run(train_setting, tmp_path, case, needle):
    out = tmp_path / "out"
    out.mkdir()
    if case == "unrelated":
        (out / "notes.txt").write_text("mine")
    if case == "fake run.json":
        (out / "run.json").write_text('{"schema": "something/else", "config": {}}')
    before = snapshot(out)
    assert_bad(train(train_setting, "static", out, "--resume"), needle.format(out=out))
    assert snapshot(out) == before


def test_a_new_run_needs_a_new_or_empty_folder(train_setting, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert_bad(train(train_setting, "static", out), "is not empty and holds no recast run")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run_ok("train", "--setting", train_setting, "--weights", "static", "--out", empty, "--device", "cpu", "--quiet",
           "--max-steps", "1")
    assert (empty / "run.json").is_file() and not list(tmp_path.glob(".*.starting-*"))


def test_one_writer_per_run_folder(train_setting, static_run, tmp_path):
    from recast_cli.train.runfolder import RunLock

    run = _copy_run(static_run, tmp_path / "run")
    before = snapshot(run)
    held = RunLock(run)  # another recast train holds the run
    try:
        assert_bad(train(train_setting, "static", run, "--resume", "--max-steps", "6"),
                   "is being written by another recast train")
        assert snapshot(run) == before
    finally:
        held.release()
    train(train_setting, "static", run, "--resume", "--max-steps", "5")  # released: it resumes
    assert [s for s, _ in ckpt.list_checkpoints(run)][-1] == 5


def test_a_run_killed_before_its_first_checkpoint_restarts_only_for_the_same_configuration(train_setting, tmp_path):
    run = tmp_path / "run"
    run_ok("train", "--setting", train_setting, "--weights", "static", "--out", run, "--device", "cpu", "--quiet",
           "--max-steps", "1")
    shutil.rmtree(run / "checkpoints")  # as if killed during the first save: only its temporary folder is left
    (run / "checkpoints" / ".step-000001.k1ll3d00.tmp").mkdir(parents=True)
    assert_bad(train(train_setting, "static", run, "--resume", "--lr", "0.5"), "holds the start of another run")
    result = train(train_setting, "static", run, "--resume", "--max-steps", "1")
    assert result.exit_code == 0, result.stderr
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"]


def test_one_step_reads_as_one_step(train_setting, tmp_path):
    result = run_ok("train", "--setting", train_setting, "--weights", "static", "--out", tmp_path / "run",
                    "--device", "cpu", "--quiet", "--max-steps", "1")
    line = " ".join(result.stdout.split())
    assert "trained step 1 (static W)" in line and "aggregate reward Σλ·r, step 1: " in line and "1-1" not in line
    shown = run_ok("inspect", tmp_path / "run" / "metrics.parquet").stdout
    assert "1 (1 step)" in shown and "(1 steps)" not in shown


@pytest.mark.parametrize("args, needle", [
    (("--max-steps", "0"), "--max-steps must be an integer from 1 to 1000000, got 0"),
    (("--group-size", "1"), "--group-size must be an integer from 2 to 1024, got 1"),
    (("--set", "nosuchkey=1"), "nosuchkey"),
    (("--set", "learning_rate"), "KEY=VALUE"),
    (("--lambda", "1,2"), "lambda has 2 values"),
    (("--set", "kl_form=\"other\""), "kl_form must be one of"),
    (("--set", "compile=2"), "compile = 2 is not a valid bool"),
    (("--set", "compile=true", "--set", "compile_backend=\"nosuch\""), "'nosuch' is not a torch.compile backend"),
])
def test_bad_options_are_refused_before_anything_is_written(train_setting, tmp_path, args, needle):
    out = tmp_path / "run"
    assert_bad(train(train_setting, "static", out, *args), needle)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix, text", [
    (".txt", "a red circle on a white background\na blue square on a black background\n"
             "a red circle on a white background\n"),
    (".jsonl", '{"prompt": "a red circle on a white background"}\n{"prompt": "a red circle on a white background"}\n'),
])
def test_a_prompt_file_with_a_duplicate_is_refused_by_the_one_reader(train_setting, tmp_path, suffix, text):
    prompts = tmp_path / f"dup{suffix}"
    prompts.write_text(text)
    out = tmp_path / "run"
    assert_bad(train(train_setting, "static", out, "--set", f'prompts="{prompts}"'),
               "prompt 'a red circle on a white background' appears twice (prompts 0 and ")
    assert not out.exists()


def test_gradient_checkpointing_trains_the_same_run(train_setting, static_run, tmp_path, monkeypatch):
    """Recomputing each block in the backward changes memory, not the update: same losses and LoRA."""
    import torch.utils.checkpoint
    from safetensors.torch import load_file

    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "gc"
    run_ok("train", "--setting", train_setting, "--weights", "static", "--out", out, "--device", "cpu", "--quiet",
           "--set", "gradient_checkpointing=true")
    assert calls  # diffusers' checkpointed blocks ran in the update
    a, b = (pd.read_parquet(run / "metrics.parquet") for run in (static_run, out))
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=0, atol=1e-7)
    step = ckpt.list_checkpoints(out)[-1][1]
    x, y = (load_file(str(run / "adapter" / LORA_FILE)) for run in (ckpt.list_checkpoints(static_run)[-1][1], step))
    diff = max(float((x[k] - y[k]).abs().max()) for k in x)
    assert diff < 1e-6, diff
    assert json.loads((out / "run.json").read_text())["config"]["run_key"] == \
        json.loads((static_run / "run.json").read_text())["config"]["run_key"]  # not part of the run key


def test_a_conflict_w_settles_by_timing_is_warned_once_and_every_step_records_the_correlations(train_setting,
                                                                                               tmp_path):
    """docs/trust.md: the estimate's conflicts (E14) where W gives one reward of the pair most of a column are one
    warning when training starts; every step's metrics rows carry each pair's advantage correlation."""
    from dataclasses import replace

    from recast_cli.artifacts import read_gains, read_metrics

    table = make_table(0.05 * bump_gains([20, 12, 4], [4, 3, 2], 25), REWARDS, grid=FLOWMATCH)
    corr = {"pairs": [["toy_color", "toy_shape"], ["toy_color", "toy_sharpness"], ["toy_shape", "toy_sharpness"]],
            "rho": [[-0.5] * 25, [0.0] * 25, [0.0] * 25], "n": 1000, "K": 2}
    gains = tmp_path / "g.parquet"
    write_gains(gains, replace(table, meta={**table.meta, "advantage_corr": corr}), config={"test": True})
    assert read_gains(gains).meta["advantage_corr"]["rho"][0][0] == -0.5
    w_path = solve(gains, tmp_path / "W.safetensors", "--steps", "4", "--grid", "flowmatch", "--shift", "3",
                   "--skip-clean", "1")
    settled = read_weights(w_path).info["settled_by_timing"]
    assert settled and settled[0]["pair"] == ["toy_color", "toy_shape"]
    out = tmp_path / "run"
    result = train(train_setting, w_path, out, "--max-steps", "2")
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    said = " ".join(result.stderr.split())
    assert said.count("rewards toy_color and toy_shape conflict") == 1 and "not by λ" in said
    rows = read_metrics(out / "metrics.parquet").to_pylist()
    assert len(rows) == 2 * 3
    for row in rows:
        corr_row = row["adv_corr"]
        assert len(corr_row) == 3 and corr_row[REWARDS.index(row["reward"])] == pytest.approx(1.0)

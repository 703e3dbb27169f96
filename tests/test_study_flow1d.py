"""`make all`'s graph for a flow1d setting (the two-timescale study), on a tiny copy of twoscale.toml.

Exact and sampled gains at the base policy, W per budget × mode (reversed included), runs,
curve evaluations (every checkpoint under the SDE, the last under the ODE), the control
setting's study beside it, and both reports: every stage through its real command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recast_cli.artifacts import read_curve, read_weights

BIN = Path(sys.executable).parent

POLICY_TRAIN = """
[policy]
kind = "flow1d"
steps = 6
noise_level = 0.7

[train]
rewards = {rewards}
lambda = [1, 1]
prompts = "prompts.txt"
train_fraction = 1.0
lora_rank = 0
max_steps = 6
group_size = 4
prompts_per_step = 4
micro_batch = 96
sample_batch = 16
learning_rate = 3e-3
beta_kl = 0.01
save_every = 2
keep_checkpoints = 3

[evaluate]
n = 512
seed = 10000
batch_size = 512
judges = []
"""

STUDY = """
[study]
budgets = {budgets}
seeds = {seeds}
modes = {modes}
gains = "exact"
estimate_steps = 6
n = 16
k = 1
p = 1
"""


def write_settings(root: Path) -> Path:
    (root / "prompts.txt").write_text("x\n")
    control = root / "control.toml"
    control.write_text(POLICY_TRAIN.format(rewards='["fine", "fine_wide"]')
                       + STUDY.format(budgets="[[1, 1]]", seeds="[0]", modes='["static", "recast"]'))
    main = root / "main.toml"
    main.write_text(POLICY_TRAIN.format(rewards='["coarse", "fine"]')
                    + STUDY.format(budgets="[[1, 2]]", seeds="[1]",
                                   modes='["static", "recast", "nosink", "reversed"]')
                    + 'control = "control.toml"\n')
    return main


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_flow1d_study_runs_end_to_end_with_its_control(tmp_path):
    setting = write_settings(tmp_path)
    root = tmp_path / "study"
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    text = subprocess.run([str(BIN / "recast"), "study-makefile", "--setting", str(setting), "--root", str(root),
                           "--recast", str(BIN / "recast")], capture_output=True, text=True, check=True,
                          env=env).stdout
    mk = tmp_path / "study.mk"
    mk.write_text(text)
    done = subprocess.run(["make", "-f", str(mk), "-j", "2", "all"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = (root / "report" / "report.md").read_text()
    assert "Primary endpoint" in report and "Secondary endpoint" in report
    for contrast in ("ReCAST − static", "reversed − static", "no-Sink − static"):
        assert contrast in report
    assert (root / "report" / "curves.png").is_file() and (root / "report" / "weights-lambda-1-2.png").is_file()
    control = (root / "control" / "report" / "report.md").read_text()
    assert "ReCAST − static" in control and "reversed − static" not in control

    # W: from the exact gains, every step trained; reversed mirrors ReCAST; the sampled W is kept for the report
    recast_w = read_weights(root / "W" / "1-2-recast.safetensors")
    reversed_w = read_weights(root / "W" / "1-2-reversed.safetensors")
    assert recast_w.trained_steps == tuple(range(1, 7))
    np.testing.assert_array_equal(reversed_w.W, recast_w.W[:, ::-1])
    assert (root / "W" / "1-2-recast-sampled.safetensors").is_file()
    # curves: checkpoints 2 and 4 under the SDE, the last under the ODE, the same seeds in every run
    curve = read_curve(root / "evals" / "1-2" / "recast-s1.parquet")
    assert curve.points == ((2, "sde"), (4, "sde"), (6, "sde")) and curve.meta["train_seed"] == 1
    final = read_curve(root / "evals" / "1-2" / "recast-s1-ode.parquet")
    assert final.points == ((6, "ode"),)
    assert "Notes" not in report  # every run has the same checkpoints
    base = read_curve(root / "evals" / "base.parquet")
    assert base.points == ((0, "sde"), (0, "ode"))

    # regenerating the report from the same artifacts gives the same bytes
    inputs = sorted(str(p) for p in (root / "evals").rglob("*.parquet")) + \
        [str(p) for p in sorted((root / "runs").glob("*/*")) if p.is_dir()] + \
        [str(root / "gains" / "exact.parquet"), str(root / "gains.parquet"),
         str(root / "W" / "1-2-recast-sampled.safetensors")]
    again = tmp_path / "again"
    subprocess.run([str(BIN / "recast"), "report", *inputs[::-1], "--out", str(again)], check=True, env=env,
                   capture_output=True)
    assert (again / "report.md").read_bytes() == (root / "report" / "report.md").read_bytes()
    assert (again / "curves.png").read_bytes() == (root / "report" / "curves.png").read_bytes()


def test_contrasts_pair_each_arm_with_static_per_seed_averaged_over_budgets():
    from recast_cli.report.statistics import contrasts
    from recast_cli.report.tables import contrast_row

    grid = {}
    for s in range(6):
        for b, shift in (((1.0, 1.0), 0.0), ((1.0, 2.0), 1.0)):
            grid[("static", b, s)] = 1.0 + shift + 0.1 * s
            grid[("recast", b, s)] = grid[("static", b, s)] + (0.02 if s < 5 else -0.01)
            grid[("reversed", b, s)] = grid[("static", b, s)] - 0.03
    items, notes = contrasts(grid)
    by = {c.mode: c for c in items}
    assert set(by) == {"recast", "reversed"} and not notes
    np.testing.assert_allclose(by["recast"].diffs, [0.02] * 5 + [-0.01])
    row = contrast_row(by["recast"])
    assert row[:3] == ["ReCAST − static", "6", "0.0150"] and row[5] == "5/1"
    from scipy import stats

    half = stats.t.ppf(0.975, 5) * np.std(by["recast"].diffs, ddof=1) / np.sqrt(6)
    assert row[4] == f"[{0.015 - half:.4f}, {0.015 + half:.4f}]"
    assert row[6] == f"{stats.binomtest(5, 6, 0.5).pvalue:.3f}"
    assert contrast_row(by["reversed"])[5] == "0/6"
    del grid[("recast", (1.0, 2.0), 3)]
    _, notes = contrasts(grid)
    assert notes == ["ReCAST seed 3: 1 of 2 budgets paired with static"]


def test_a_flow1d_study_that_would_prune_checkpoints_is_refused(tmp_path):
    from typer.testing import CliRunner

    from recast_cli.cli import app

    setting = write_settings(tmp_path)
    setting.write_text(setting.read_text().replace("keep_checkpoints = 3\n", ""))
    result = CliRunner().invoke(app, ["study-makefile", "--setting", str(setting), "--root", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "keep_checkpoints = 2 keeps fewer than the 3 a run saves; set keep_checkpoints = 3" in result.stderr

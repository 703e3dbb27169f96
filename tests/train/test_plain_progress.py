"""Progress a user can follow in a batch job's log (issue 43 §5): with stderr not a terminal, `recast train`
prints one plain line per step (step, each reward, kl, s/step, time left) in place of the bar."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from recast_cli.train.metrics import PlainProgress, clock_text

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"train step (\d+)/3  reward [0-9.]+ \(coarse [0-9.]+, fine [0-9.]+\)  kl \S+  [0-9.]+ s/step  "
                  r"left \S+")


def test_the_line_names_every_reward_and_the_time_left():
    ticks = iter([100.0, 130.0])
    plain = PlainProgress(goal=10, start=4, clock=lambda: next(ticks))
    line = plain.line(6, {"clip": {"reward_mean": 0.25}, "ocr": {"reward_mean": 0.5}}, {"aggregate": 0.75, "kl": 1e-3})
    assert line == "train step 6/10  reward 0.7500 (clip 0.2500, ocr 0.5000)  kl 1.00e-03  15.00 s/step  left 1m00s"
    assert [clock_text(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


def test_train_prints_one_plain_line_per_step_when_stderr_is_not_a_terminal(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "recast_cli", "train", "--setting", "twoscale", "--weights", "static",
            "--max-steps", "3"]
    done = subprocess.run([*args, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    steps = [int(m.group(1)) for m in map(LINE.search, done.stderr.splitlines()) if m]
    assert steps == [1, 2, 3], done.stderr


def test_progress_lines_prefix_each_line_with_the_run_and_a_bad_value_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "recast_cli", "train", "--setting", "twoscale", "--weights", "static",
            "--max-steps", "1", "--out", str(tmp_path / "runs" / "b" / "static-s0")]
    done = subprocess.run([*args, "--progress", "lines"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "b/static-s0: train step 1/1  reward" in done.stderr, done.stderr
    bad = subprocess.run([*args, "--progress", "loud"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "recast: error: --progress must be auto, lines or none, got 'loud'"], bad.stderr

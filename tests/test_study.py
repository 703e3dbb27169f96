"""`make all`'s graph (`recast study-makefile`) on the tiny toy setting: its recipes and its refusals.

One budget × two modes × one seed after a one-step warmup. The image route's graph runs end to end,
and resumes after a kill doing only what was left, in tests/test_study_paper_settings.py (ocr, over
tiny stand-ins of every model it names).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.conftest import tiny_train_setting

BIN = Path(sys.executable).parent
STUDY = """
[study]
budgets = [[1, 2, 1]]
seeds = [0]
modes = ["static", "recast"]
warmup_steps = 1
estimate_steps = 4
n = 2
k = 1
p = 2
positives = "renderer"

[evaluate]
prompts = "toy"
n = 1
seed = 10000
batch_size = 24
"""


def test_the_graph_runs_the_warmup_positives_estimates_every_mode_and_the_report(tmp_path):
    setting = tiny_train_setting(tmp_path, extra=STUDY)
    root = tmp_path / "study"
    text = subprocess.run([str(BIN / "recast"), "study-makefile", "--setting", str(setting), "--root", str(root),
                           "--recast", str(BIN / "recast")], capture_output=True, text=True, check=True).stdout
    solves = [line for line in text.splitlines() if "solve-w" in line]
    kinds = [line.split(" --mode ")[1].split(" --tau")[0] for line in solves]
    assert kinds == ["static --kernel exp", "recast --kernel exp"]
    lines = [line.replace("$(RECAST_TRAIN)", "$(RECAST) train") for line in text.splitlines()
             if line.startswith(("\t$(RECAST) ", "\t$(RECAST_TRAIN) "))]
    recipes = [line.split()[1] for line in lines]
    judges = [line for line in lines if "--add-judges" in line]
    assert recipes.count("train") == 3 and recipes.count("evaluate") == 3 + 3  # the warmup and each mode; base + modes
    assert len(judges) == 3  # `make judges`: each evaluation again, its judges added
    assert all("--judges ''" in line for line in lines if " evaluate " in line and line not in judges)
    assert recipes.count("estimate") == 4  # at the warmup, and D at the base model and at both trained checkpoints
    assert {"sample-positive", "solve-w", "report"} <= set(recipes)


def test_study_makefile_bad_setting_is_one_line(tmp_path):
    setting = tiny_train_setting(tmp_path, extra="\n[study]\nbudgets = [[1, 2]]\n")
    out = subprocess.run([str(BIN / "recast"), "study-makefile", "--setting", str(setting)], capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "budgets[0]" in out.stderr


@pytest.mark.parametrize("flag, value, bad", [
    ("--root", "a;touch pwned", ";"), ("--root", "a b", " "), ("--root", "$(shell touch pwned)", "$"),
    ("--root", "a#b", "#"), ("--recast", "recast;touch pwned", ";"),
])
def test_study_paths_make_or_the_shell_would_read_are_refused(tmp_path, flag, value, bad):
    from typer.testing import CliRunner

    from recast_cli.cli import app

    args = ["study-makefile", "--setting", "toy", flag, value]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert f"the character {bad!r} is not allowed in a study's paths" in result.stderr
    assert not (tmp_path / "pwned").exists()

"""`make all`'s graph (`recast study-makefile`) on the tiny toy setting: end to end, then resumed.

One budget × two modes × one seed after a one-step warmup: every stage runs through its real
command, the report is written, and a second `make` (after a stage's output was removed, as a
kill would leave it) redoes only that stage and what depends on it.
"""

from __future__ import annotations

import shutil
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


def _make(mk: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}  # two recipes at once, a core each
    return subprocess.run(["make", "-j2", "-f", str(mk), "all", *extra], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_study_runs_end_to_end_and_resumes(tmp_path):
    setting = tiny_train_setting(tmp_path, extra=STUDY)
    root = tmp_path / "study"
    text = subprocess.run([str(BIN / "recast"), "study-makefile", "--setting", str(setting), "--root", str(root),
                           "--recast", str(BIN / "recast")], capture_output=True, text=True, check=True).stdout
    solves = [line for line in text.splitlines() if "solve-w" in line]
    kinds = [line.split(" --mode ")[1].split(" --tau")[0] for line in solves]
    assert kinds == ["static --kernel exp", "recast --kernel exp"]
    mk = tmp_path / "study.mk"
    mk.write_text(text)
    first = _make(mk, tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    report = root / "report" / "report.md"
    assert report.is_file() and "ReCAST" in report.read_text() and "Table 6" in report.read_text()
    for mode in ("static", "recast"):
        assert (root / "runs" / "1-2-1" / f"{mode}-s0" / ".done").is_file()
        assert (root / "evals" / "1-2-1" / f"{mode}-s0.parquet").is_file()
    # nothing left to do
    again = _make(mk, tmp_path, "--question")
    assert again.returncode == 0, again.stdout
    # a kill mid-way: the ReCAST run's stamp and its evaluation are gone; only they are redone
    gains_mtime = (root / "gains.parquet").stat().st_mtime_ns
    static_eval = (root / "evals" / "1-2-1" / "static-s0.parquet").stat().st_mtime_ns
    (root / "runs" / "1-2-1" / "recast-s0" / ".done").unlink()
    (root / "evals" / "1-2-1" / "recast-s0.parquet").unlink()
    resumed = _make(mk, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    recipes = [line for line in resumed.stdout.splitlines() if " --out " in line]
    redone = sorted(line.split(" --out ")[1].split()[0].rsplit("/", 3)[-1] for line in recipes)
    # train, its D estimate (Table 6), its evaluation, the report
    assert redone == ["1-2-1-recast-s0.parquet", "recast-s0", "recast-s0.parquet", "report"], redone
    assert (root / "gains.parquet").stat().st_mtime_ns == gains_mtime
    assert (root / "evals" / "1-2-1" / "static-s0.parquet").stat().st_mtime_ns == static_eval
    assert (root / "evals" / "1-2-1" / "recast-s0.parquet").is_file()


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

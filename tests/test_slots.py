"""`make all JOBS=N GPUS=...`: each job of a study's graph takes a GPU of its own (recast_cli/study/slots.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from recast_cli.study.slots import parse_gpus

ROOT = Path(__file__).resolve().parents[1]
SHOW = "import os, sys, time; time.sleep(float(sys.argv[1])); print(os.environ['CUDA_VISIBLE_DEVICES'])"


def slot(folder: Path, gpus: str, hold: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(folder), "--gpus", gpus,
                             "--", sys.executable, "-c", SHOW, str(hold)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def test_concurrent_jobs_get_different_gpus_and_a_third_waits_for_one(tmp_path):
    first, second = slot(tmp_path, "0,1", 1.5), slot(tmp_path, "0,1", 1.5)
    time.sleep(0.5)
    start = time.monotonic()
    third = slot(tmp_path, "0,1", 0)
    outs = [p.communicate(timeout=60)[0].strip() for p in (first, second, third)]
    assert sorted(outs[:2]) == ["0", "1"] and outs[2] in ("0", "1")
    assert time.monotonic() - start >= 0.5  # it waited for a GPU to be given back
    assert all(p.returncode == 0 for p in (first, second, third))


def test_the_exit_code_is_the_commands_and_bad_gpus_are_one_line(tmp_path):
    failing = subprocess.run([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(tmp_path), "--gpus", "0",
                              "--", sys.executable, "-c", "raise SystemExit(3)"], cwd=ROOT)
    assert failing.returncode == 3
    bad = subprocess.run([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(tmp_path), "--gpus", "0,x",
                          "--", "true"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "GPUS='0,x'" in bad.stderr


def test_several_gpus_per_job():
    assert parse_gpus("0+1,2+3") == ["0,1", "2,3"] and parse_gpus("3") == ["3"]
    with pytest.raises(ValueError, match="twice"):
        parse_gpus("0,0")


def test_make_all_passes_the_wrapper_to_the_graph():
    shown = subprocess.run(["make", "-s", "--eval", "show-recast: ; @echo $(STUDY_RECAST)", "show-recast",
                            "SETTING=toy", "JOBS=2", "GPUS=0,1"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "-m recast_cli.study.slots --dir artifacts/toy/.slots --gpus 0,1 -- .venv/bin/recast" in shown.stdout
    unset = subprocess.run(["make", "-s", "--eval", "show-recast: ; @echo [$(STUDY_RECAST)]", "show-recast"],
                           cwd=ROOT, capture_output=True, text=True)
    assert unset.stdout.strip() == "[]"


def test_launch_trains_each_run_through_accelerate():
    shown = subprocess.run(["make", "-s", "--eval", "show-launch: ; @echo $(STUDY_LAUNCH)", "show-launch",
                            "SETTING=toy", "LAUNCH=accelerate launch --num_processes 4", "GPUS=0+1+2+3,4+5+6+7"],
                           cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == ("RECAST_TRAIN=.venv/bin/python -m recast_cli.study.slots --dir "
                                    "artifacts/toy/.slots --gpus 0+1+2+3,4+5+6+7 -- accelerate launch "
                                    "--num_processes 4 -m recast_cli train")
    graph = subprocess.run([sys.executable, "-m", "recast_cli", "study-makefile", "--setting", "twoscale", "--root",
                            "/tmp/x"], cwd=ROOT, capture_output=True, text=True)
    assert graph.returncode == 0, graph.stderr
    assert "RECAST_TRAIN ?= $(RECAST) train" in graph.stdout

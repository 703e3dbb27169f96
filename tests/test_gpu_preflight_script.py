"""benchmarks/gpu_preflight.sh, the GPU check in one command (`make gpu-preflight`; on a machine
without the venv, `WHEELS=.whl PY=python3`): what it records, and that a broken stack stops it
before any check spends GPU time. The settings' preflight itself is tests/test_preflight.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_preflight.sh"


def run(out: Path, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("WHEELS", "SITE", "SCALE", "STEP_TIMEOUT", "PYTHONPATH", "SETTINGS")}
    full = {**inherited, "OUT": str(out), "PY": sys.executable, "SETTINGS": "", **env}
    return subprocess.run(["bash", str(SCRIPT)], cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


def test_the_check_records_the_stack_runs_the_offload_tests_and_each_setting_on_its_own(tmp_path):
    """Started outside the checkout with relative paths (they are the caller's): versions.txt, the offload
    tests passed, and a setting path that is not there is that step's failure (recast's one line, exit
    2), so the run exits 1 and does not say every step passed."""
    out = tmp_path / "preflight"
    done = run(Path("preflight"), cwd=tmp_path, SETTINGS="missing/absent.toml")
    assert done.returncode == 1, done.stdout + done.stderr
    versions = (out / "versions.txt").read_text()
    for name in ("python", "torch", "diffusers", "transformers", "open_clip_torch"):
        assert any(line.startswith(name + " ") for line in versions.splitlines()), (name, versions)
    offload = (out / "offload.txt").read_text()
    assert " passed" in offload and "failed" not in offload
    log = (out / "log.txt").read_text()
    assert "tests/test_offload.py" in log and "offload: " in log
    assert "absent FAILED (exit 2; fits: no preflight.json)" in log and "no setting" in log
    assert str(tmp_path / "missing" / "absent.toml") in log
    assert "every step passed" not in log and "a step FAILED" in log

def test_a_step_past_its_timeout_is_killed_counted_as_failed_and_the_rest_still_run(tmp_path):
    """STEP_TIMEOUT=1 kills the offload tests (they take seconds); the settings' step still runs, and
    the run exits 1. A setting that is not there fails on its own: one line from recast, exit 2."""
    out = tmp_path / "preflight"
    done = run(out, STEP_TIMEOUT="1", SETTINGS="ocr")
    assert done.returncode == 1, done.stdout + done.stderr
    log = (out / "log.txt").read_text()
    assert "tests/test_offload.py FAILED (killed after STEP_TIMEOUT=1 s" in log
    assert "ocr FAILED (killed after STEP_TIMEOUT=1 s; fits: no preflight.json)" in log
    assert "a step FAILED" in log and not (out / "ocr" / "preflight.json").exists()


def test_a_wheel_folder_without_wheels_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "wheels").mkdir()
    done = run(tmp_path / "out", WHEELS=str(tmp_path / "wheels"))
    assert done.returncode == 2
    assert done.stdout.strip().count("\n") == 0 and "holds no .whl file" in done.stdout
    assert not (tmp_path / "out" / "versions.txt").exists()


def test_wheels_pip_cannot_install_stop_it_before_any_check(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    done = run(tmp_path / "out", WHEELS=str(wheels), SITE=str(tmp_path / "site"))
    assert done.returncode == 2
    assert "pip could not install the wheels" in done.stdout
    assert not (tmp_path / "out" / "versions.txt").exists()


def test_a_stack_that_cannot_import_recast_stops_it_before_any_check(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'diffusers'\" >&2\nexit 1\n")
    python.chmod(0o755)
    done = run(tmp_path / "out", PY=str(python), SETTINGS="ocr")
    assert done.returncode == 2
    assert "cannot import recast" in done.stdout and "No module named 'diffusers'" in done.stdout
    assert not (tmp_path / "out" / "offload.txt").exists() and not (tmp_path / "out" / "ocr").exists()


def test_the_device_wheels_are_pinned_one_per_distribution():
    names = []
    for line in (ROOT / "benchmarks" / "device-wheels.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert name and version and "=" not in version, line
            names.append(name.lower().replace("_", "-"))
    assert len(names) == len(set(names))
    # what the device image lacks and recast imports on the way to a preflight
    assert {"diffusers", "open-clip-torch", "huggingface-hub", "transformers"} <= set(names)

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


def run(out: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "OUT": str(out), "PY": sys.executable, "SETTINGS": "", **env}
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)


def test_the_check_records_the_stack_and_runs_the_offload_tests(tmp_path):
    out = tmp_path / "preflight"
    done = run(out)
    assert done.returncode == 0, done.stdout + done.stderr
    versions = (out / "versions.txt").read_text()
    for name in ("python", "torch", "diffusers", "transformers", "open_clip_torch"):
        assert any(line.startswith(name + " ") for line in versions.splitlines()), (name, versions)
    offload = (out / "offload.txt").read_text()
    assert " passed" in offload and "failed" not in offload
    log = (out / "log.txt").read_text()
    assert "every step passed" in log and "tests/test_offload.py" in log


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

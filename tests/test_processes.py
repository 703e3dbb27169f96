"""recast_cli/processes.py: what every child recast starts goes through (issue 51, the first bullet)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recast_cli import processes

#: A child that ignores SIGTERM and starts a grandchild that ignores it too; both record their pids.
STUBBORN = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
            "open(sys.argv[1], 'w').write(f'{os.getpid()} {g.pid}'); time.sleep(600)")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except OSError:
        return True
    return state == "Z"


def wait_file(path: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def test_stop_kills_a_group_that_ignores_sigterm_after_the_grace(tmp_path):
    pids_file = tmp_path / "pids"
    child = processes.start([sys.executable, "-c", STUBBORN, str(pids_file)])
    pids = wait_file(pids_file)
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)  # a process group of its own
    start = time.monotonic()
    code = processes.stop(child, grace=1.0)
    took = time.monotonic() - start
    assert code == 128 + signal.SIGKILL and 1.0 <= took < 15
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids), "the grandchild outlived the stop"


def test_a_child_gets_sigterm_when_its_parent_dies(tmp_path):
    """SIGKILL on recast cannot be handled: the parent death signal stops what it started."""
    pid_file = tmp_path / "pid"
    parent = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from recast_cli import processes; "
                               "processes.start([sys.executable, '-c', 'import os, sys, time; "
                               "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(600)', sys.argv[1]]); "
                               "time.sleep(600)", str(pid_file)], cwd=Path(__file__).resolve().parents[1])
    child = wait_file(pid_file)[0]
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)


@pytest.mark.parametrize("returncode, code", [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_exit_codes_are_the_shells(returncode, code):
    assert processes.exit_code(returncode) == code

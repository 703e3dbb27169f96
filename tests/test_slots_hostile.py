"""The GPU-slot wrapper (recast_cli/study/slots.py) against what a shared study folder may hold and how a
job may end (issue 51, item 13): locks are regular files of its own, bad input is one line and exit 2,
a signal's exit code is 128 + N, and the GPU stays locked while the command runs, even once the wrapper
is gone."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def wrap(folder, gpus: str, *command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(folder), "--gpus", gpus,
                           "--", *command], cwd=ROOT, capture_output=True, text=True, timeout=60, **kwargs)


def one_error_line(done: subprocess.CompletedProcess, needle: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recast: error: ") and needle in lines[0], done.stderr


def test_a_dangling_symlinked_lock_is_refused_and_nothing_is_created_outside(tmp_path):
    slots, outside = tmp_path / "slots", tmp_path / "elsewhere" / "planted"
    slots.mkdir()
    outside.parent.mkdir()
    (slots / "gpu-0.lock").symlink_to(outside)
    done = wrap(slots, "0", "true")
    one_error_line(done, "is a symbolic link")
    assert not outside.exists()


def test_a_lock_that_is_a_folder_a_dir_that_is_a_file_and_a_missing_command_are_one_line(tmp_path):
    slots = tmp_path / "slots"
    (slots / "gpu-0.lock").mkdir(parents=True)
    one_error_line(wrap(slots, "0", "true"), "is a folder")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    one_error_line(wrap(a_file, "0", "true"), "not a folder")
    one_error_line(wrap(tmp_path / "ok", "0", str(tmp_path / "no-such-command")), "no such command")
    one_error_line(subprocess.run([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(tmp_path)],
                                  cwd=ROOT, capture_output=True, text=True), "usage:")


@pytest.mark.parametrize("gpus", ["¹,٣", "٣", "0,²"])
def test_gpu_indices_are_ascii_digits(tmp_path, gpus):
    one_error_line(wrap(tmp_path, gpus, "true"), "a comma-separated list of GPU indices")


def test_a_command_killed_by_a_signal_exits_128_plus_it(tmp_path):
    done = wrap(tmp_path, "0", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == 128 + signal.SIGKILL


def locked(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def wait_for(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


HOLD = "import sys, time; open(sys.argv[1], 'w').write(str(__import__('os').getpid())); time.sleep(float(sys.argv[2]))"


def test_a_sigkilled_wrapper_leaves_the_gpu_locked_while_its_command_runs(tmp_path):
    """The command ignores SIGTERM for a while (as a run writing its checkpoint would): the lock must be
    held until the command itself has exited, not freed with the wrapper."""
    slots, pid_file = tmp_path / "slots", tmp_path / "pid"
    stubborn = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: None); "
                "open(sys.argv[1], 'w').write(str(__import__('os').getpid())); time.sleep(3)")
    wrapper = subprocess.Popen([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(slots), "--gpus", "0",
                                "--", sys.executable, "-c", stubborn, str(pid_file)], cwd=ROOT)
    assert wait_for(lambda: pid_file.exists() and pid_file.stat().st_size > 0)
    command = int(pid_file.read_text())
    wrapper.kill()
    wrapper.wait(timeout=30)
    assert locked(slots / "gpu-0.lock")  # the wrapper is gone, its command holds the GPU
    assert wait_for(lambda: not Path(f"/proc/{command}").exists() or
                    Path(f"/proc/{command}/stat").read_text().split(") ")[-1][0] == "Z", 30)
    assert wait_for(lambda: not locked(slots / "gpu-0.lock"), 10)  # and frees it when it ends


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_wrapper_reaches_the_command_once_and_the_exit_is_128_plus_it(tmp_path, signum):
    """The command counts the signals it gets and exits 0 after the first; the wrapper reports 128 + N."""
    slots, pid_file, seen = tmp_path / "slots", tmp_path / "pid", tmp_path / "seen"
    counting = ("import signal, sys, time, os\n"
                "def got(n, f):\n    open(sys.argv[2], 'a').write(f'{n}\\n'); time.sleep(0.5); sys.exit(0)\n"
                "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(s, got)\n"
                "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)\n")
    wrapper = subprocess.Popen([sys.executable, "-m", "recast_cli.study.slots", "--dir", str(slots), "--gpus", "0",
                                "--", sys.executable, "-c", counting, str(pid_file), str(seen)], cwd=ROOT)
    assert wait_for(lambda: pid_file.exists() and pid_file.stat().st_size > 0)
    wrapper.send_signal(signum)
    assert wrapper.wait(timeout=60) == 128 + signum
    assert seen.read_text().split() == [str(int(signum))]
    assert not locked(slots / "gpu-0.lock")

"""``recast serve-judges`` ended by a signal (issue 51, items 1 and 4): the judge's server and the wrapped
command never outlive recast, whichever signal ends it, and the server's log is a regular file of recast's.

A real recast process wraps a command that records its pid and sleeps; once the fake vLLM serves and the
command runs, recast is sent the signal. Afterwards recast has exited 128 + the signal, the server's
port is closed, and neither the server nor the command (nor a child the command started) is alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.evaluate.test_serve_judges import ROOT, answers, world  # noqa: F401 (world: the fixture)

#: The wrapped command: a child of its own that sleeps (so the whole group must be stopped), its pids
#: recorded, then sleep.
COMMAND = ("import json, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
           "'import time; time.sleep(600)']); json.dump([__import__('os').getpid(), child.pid], "
           "open(sys.argv[1], 'w')); time.sleep(600)")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie that no one has reaped yet is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def wait_for(predicate, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_recast(world, pids: Path, err) -> subprocess.Popen:
    """recast serve-judges wrapping COMMAND; its output to the file ``err`` (a pipe would stay open while
    any child holds it)."""
    return subprocess.Popen([sys.executable, "-m", "recast_cli", "serve-judges", "--setting", str(world["setting"]),
                             "--vllm", str(world["vllm"]), "--logs", str(world["logs"]), "--", sys.executable,
                             "-c", COMMAND, str(pids)], env=world["env"], cwd=ROOT, stdout=err, stderr=err)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_recast_stops_the_server_and_the_command(world, tmp_path, signum):
    pids, output = tmp_path / "pids.json", tmp_path / "recast.out"
    with open(output, "w") as sink:
        recast = start_recast(world, pids, sink)
    try:
        assert wait_for(lambda: pids.exists() and pids.stat().st_size > 0), output.read_text()
        server_pid = json.loads(world["record"].read_text())["pid"]
        command_pids = json.loads(pids.read_text())
        assert answers(world["port"]) and alive(server_pid)
        recast.send_signal(signum)
        recast.wait(timeout=90)
        err = output.read_text()
    finally:
        if recast.poll() is None:
            recast.kill()
    if signum != signal.SIGKILL:  # SIGKILL cannot be handled: the children's parent death signal stops them
        assert recast.returncode == 128 + signum, err
        assert "server stopped" in err
        assert err.strip().splitlines()[-1].startswith("recast: "), err
    assert wait_for(lambda: not alive(server_pid), 30), f"the judge's server outlived recast ({signum!r})"
    assert wait_for(lambda: not answers(world["port"]), 30)
    if signum != signal.SIGKILL:  # the command is stopped with its group (with SIGKILL: by its own parent-death)
        assert wait_for(lambda: not any(alive(p) for p in command_pids), 30), "the command outlived recast"
    else:
        assert wait_for(lambda: not alive(command_pids[0]), 30)


@pytest.fixture(autouse=True)
def _tidy(tmp_path):
    """Whatever the outcome, no sleeper of COMMAND is left behind (with SIGKILL, the grandchild is the
    command's to stop, and a failing run leaves it all)."""
    yield
    pids = tmp_path / "pids.json"
    for pid in json.loads(pids.read_text()) if pids.exists() and pids.stat().st_size else ():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_server_log_that_is_a_symlink_or_a_fifo_is_refused_and_nothing_starts(world, tmp_path):
    victim = tmp_path / "users-file.txt"
    victim.write_text("the user's own words\n")
    world["logs"].mkdir()
    log = world["logs"] / "unifiedreward.log"
    marker = tmp_path / "ran"
    for plant in (lambda: log.symlink_to(victim), lambda: os.mkfifo(log), lambda: os.link(victim, log)):
        if log.exists() or log.is_symlink():
            log.unlink()
        plant()
        done = subprocess.run([sys.executable, "-m", "recast_cli", "serve-judges", "--setting",
                               str(world["setting"]), "--vllm", str(world["vllm"]), "--logs", str(world["logs"]),
                               "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                              capture_output=True, text=True, env=world["env"], cwd=ROOT, timeout=60)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("recast: error: judge unifiedreward's log") and str(log) in line, line
        assert victim.read_text() == "the user's own words\n"
        assert not marker.exists() and not world["record"].exists()  # no server, no command


def test_the_wrapped_command_killed_by_a_signal_exits_128_plus_it(world):
    done = subprocess.run([sys.executable, "-m", "recast_cli", "serve-judges", "--setting", str(world["setting"]),
                           "--vllm", str(world["vllm"]), "--logs", str(world["logs"]), "--", sys.executable, "-c",
                           "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                          capture_output=True, text=True, env=world["env"], cwd=ROOT, timeout=120)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert not answers(world["port"])

"""`recast serve-reward` under a flood of sockets without the token (issue 51, item 5).

The attack: 64 sockets from one address, each reopened 0.2 s after the server closes it. Every new one
closes an idle one to make room (test_server_hostile.py), and each closing wrote a line to stderr: about
300 lines a second. Where nobody read the server's stderr pipe, it filled, and every thread that logged
(the accepting thread among them) waited on it for good: every request with the token timed out. Now no
thread waits on stderr (a line it cannot take at once is left out and counted), and the closings are
written once per address every 10 s with the count left out. The server runs as `recast serve-reward`
in a process of its own; its stderr pipe is full before it starts.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from recast_cli.rewards import build_scorer
from tests.rewards.conftest import noise_images

TOKEN = "t0ken-of-the-flood-tests"
PROMPT = "a red circle on a white background"


class Flood:
    """``count`` idle sockets without the token to ``port``, each reopened ``delay`` s after the server
    closes it, in a daemon thread, until stopped."""

    def __init__(self, port: int, count: int = 64, delay: float = 0.2) -> None:
        self.port, self.count, self.delay, self.opened = port, count, delay, 0
        self.sockets: list[socket.socket] = []
        self.due: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        with contextlib.suppress(OSError):
            self.sockets.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            self.opened += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            for sock in select.select(self.sockets, [], [], 0.01)[0] if self.sockets else ():
                self.sockets.remove(sock)  # closed by the server (or answered: 408): reopened after the delay
                sock.close()
                self.due.append(time.monotonic() + self.delay)
            now = time.monotonic()
            for when in [when for when in self.due if when <= now]:
                self.due.remove(when)
                self._open()
            if not self.sockets:
                time.sleep(0.01)

    def __enter__(self) -> Flood:
        for _ in range(self.count):
            self._open()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()


@contextlib.contextmanager
def serve_reward(stderr: int, cwd: Path):
    """``recast serve-reward toy_color --token …`` on a free port, run in ``cwd`` (not the checkout: the
    ``recast_cli`` of $PYTHONPATH, else the installed one), its stderr the descriptor ``stderr``; yields
    (process, url)."""
    process = subprocess.Popen([sys.executable, "-m", "recast_cli", "serve-reward", "toy_color", "--port", "0",
                                "--token", TOKEN], cwd=cwd, stdout=subprocess.PIPE, stderr=stderr,
                               stdin=subprocess.DEVNULL, text=True)
    try:
        assert select.select([process.stdout], [], [], 60)[0], "serve-reward did not start"
        line = process.stdout.readline()
        assert line.startswith("serving toy_color on http://127.0.0.1:"), line
        yield process, line.split(" on ", 1)[1].split()[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        process.stdout.close()


def scored_in_time(url: str, count: int, seconds: float) -> list[float]:
    """Seconds each of ``count`` requests with the token took (one try of ``seconds`` each: a timeout fails)."""
    took = []
    for i in range(count):
        started = time.monotonic()
        scorer = build_scorer(f"toy_color@{url}", token=TOKEN, timeout=seconds, retries=1)
        assert scorer.score(noise_images(1, size=16, seed=i), [PROMPT]).shape == (1,)
        took.append(time.monotonic() - started)
    return took


def read_until(fd: int, needle: str, wait: float = 5.0) -> str:
    """What can be read from the non-blocking ``fd`` until ``needle`` is among it, or ``wait`` s passed."""
    text, deadline = "", time.monotonic() + wait
    while needle not in text and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            text += os.read(fd, 65536).decode()
    return text


def test_a_flood_without_the_token_cannot_hold_the_server_on_a_stderr_nobody_reads(tmp_path):
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):  # full from the start: any line that waits, waits for good
        while True:
            os.write(write_end, b"." * 4096)
    os.set_blocking(write_end, True)  # the server's stderr blocks, as a pipe's does
    try:
        with serve_reward(write_end, tmp_path) as (_, url), Flood(int(url.rsplit(":", 1)[1])) as flood:
            time.sleep(1.0)  # some 300 closings to make room
            took = scored_in_time(url, 5, seconds=3.0)
            assert flood.opened > 64
            os.set_blocking(read_end, False)
            with contextlib.suppress(BlockingIOError):  # someone reads stderr again
                while os.read(read_end, 65536):
                    pass
            scored_in_time(url, 1, seconds=3.0)  # its line says how many were left out
            log = read_until(read_end, "POST /v1/score 200")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert max(took) < 1.0, took  # served at once (a request timed out at 3 s while the server waited on stderr)
    assert "log lines left out (stderr was not being read)" in log and "POST /v1/score 200" in log, log


def test_a_flood_without_the_token_writes_a_line_per_address_not_one_per_socket(tmp_path):
    log = tmp_path / "serve-reward.log"
    with log.open("w") as sink, serve_reward(sink.fileno(), tmp_path) as (_, url), \
            Flood(int(url.rsplit(":", 1)[1])) as flood:
        time.sleep(1.5)
        took = scored_in_time(url, 3, seconds=3.0)
        opened = flood.opened
    lines = log.read_text().splitlines()
    closings = [line for line in lines if "to make room for a new connection" in line]
    assert opened > 200 and max(took) < 1.0  # hundreds of sockets closed to make room, the requests served
    assert len(closings) == 1, f"{len(closings)} lines"  # was one line per closing: 300 a second
    assert sum("POST /v1/score 200" in line for line in lines) == 3 and "Traceback" not in log.read_text()

"""The processes recast starts, stopped however recast ends.

A signal that ends recast — SIGINT (Ctrl-C), SIGTERM (``kill``, ``timeout``, a batch scheduler's time
limit) or SIGHUP (a closed terminal) — becomes an exception in recast's main thread (:func:`raising_on_stop`:
:class:`Stopped`, or Python's own ``KeyboardInterrupt`` for SIGINT), so every ``finally`` runs: output locks
are released, temporary files removed, and each child recast started is stopped. recast then exits
128 + the signal's number (130, 143, 129), as a shell reports a process killed by it.

Every child is started by :func:`start` in a process group of its own: a signal meant for the child
reaches everything it started in turn (vLLM's engine processes, a Make recipe's commands), and is sent
once, by recast (a terminal's Ctrl-C reaches recast's group only, which forwards it). On Linux the child
is also asked to receive SIGTERM when recast dies without a chance to clean up (SIGKILL: the parent
death signal), so not even ``kill -9`` on recast leaves a GPU server running. :func:`stop` ends a child:
the signal to its group, a grace period, then SIGKILL to the group; further stop signals are ignored
while it waits, so a second Ctrl-C cannot cut the clean-up short.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: The signals that end recast, each as an exception that lets its clean-up run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds a child has between the stop signal and SIGKILL.
GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


class Stopped(BaseException):
    """recast was sent ``signum`` (SIGTERM or SIGHUP; SIGINT stays ``KeyboardInterrupt``): a BaseException,
    so that no ``except Exception`` swallows it on its way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def code(self) -> int:
        """The exit code of a process ended by this signal: 128 + its number."""
        return 128 + self.signum


def signal_of(exc: BaseException) -> int:
    """The signal an exception that stops recast stands for (``KeyboardInterrupt``: SIGINT)."""
    return exc.signum if isinstance(exc, Stopped) else int(signal.SIGINT)


def exit_code(returncode: int) -> int:
    """A child's exit code as a shell reports it: a child killed by signal N (Popen's ``-N``) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def raising_on_stop() -> Iterator[None]:
    """For the block: SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (SIGINT raises Python's
    ``KeyboardInterrupt`` as always); the previous handlers come back after it. The first signal raises;
    one that arrives while that one unwinds is ignored (the clean-up it would cut short is under way).
    Outside the main thread (where signals cannot be handled) the block runs as it is."""
    if not _in_main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if raised:
            return
        raised.append(signum)
        raise Stopped(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


@contextmanager
def shielded() -> Iterator[None]:
    """For the block (a clean-up): SIGINT, SIGTERM and SIGHUP are ignored in the main thread, so that a
    second Ctrl-C or a scheduler's repeated SIGTERM cannot cut it short. SIGKILL still can; the children's
    parent death signal covers that."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for signum in previous:
        signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


def _child_setup(keep_group: bool) -> None:
    """Run in the child before it executes: its own process group, and SIGTERM when its parent dies."""
    if not keep_group:
        os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def start(command: Sequence[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(command, **popen)`` in a process group of its own, sent SIGTERM if recast dies.
    A command that is not there is FileNotFoundError, as Popen raises it."""
    return subprocess.Popen(list(command), preexec_fn=lambda: _child_setup(False), **popen)  # noqa: PLW1509


def stop(process: subprocess.Popen, first: int = signal.SIGTERM, grace: float = GRACE_S) -> int:
    """End ``process`` and everything in its group: ``first`` to the group, up to ``grace`` seconds for all
    of it to exit, then SIGKILL to the group. Its exit code (as :func:`exit_code` gives it)."""
    with shielded():
        for sig, wait in ((first, grace), (signal.SIGKILL, 10.0)):
            if not _alive(process):
                break
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):  # the group is gone: the child alone, if it is not
                if process.poll() is None:
                    process.send_signal(sig)
            deadline = time.monotonic() + wait
            while _alive(process) and time.monotonic() < deadline:
                time.sleep(0.05)
        process.poll()
    return exit_code(process.returncode if process.returncode is not None else -int(signal.SIGKILL))


def _alive(process: subprocess.Popen) -> bool:
    """True while ``process`` or anything left in its process group runs (the child is reaped first)."""
    if process.poll() is None:
        return True
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def run(command: Sequence[str], grace: float = GRACE_S, **popen: Any) -> int:
    """Run ``command`` to its end in a process group of its own (:func:`start`) and return its exit code
    (128 + N when signal N killed it). When recast is stopped meanwhile (Ctrl-C, SIGTERM, SIGHUP), the same
    signal goes to the command's group, which has ``grace`` seconds before SIGKILL; the stop then goes on
    up (the exception is raised again)."""
    process = start(command, **popen)
    try:
        return exit_code(process.wait())
    except (KeyboardInterrupt, Stopped) as exc:
        stop(process, signal_of(exc), grace)
        raise


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"

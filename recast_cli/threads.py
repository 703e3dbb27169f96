"""How many CPU threads torch gets, chosen once before torch is imported.

The rule, first match wins:

1. ``RECAST_THREADS=N`` (a positive integer) — N threads; ``RECAST_THREADS=auto`` skips to 3.
2. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` already set by the user — left as they are.
   ``make all JOBS=N`` sets ``OMP_NUM_THREADS=1`` for its recipes, because N processes share
   the cores.
3. ``recast study --shard i/n`` with n > 1 (n processes that share the machine at once):
   one n-th of the cores each (:func:`share_cores`). Measured on the 2-core machine (the ladder
   study's pilot, docs/benchmarks.md): two shards of 2 threads each took 90–104 s per cell of 64
   seeds, two of 1 thread 34–41 s — 2.5 times faster.
4. Otherwise torch's own default (one thread per core). Measured on the idle 2-core machine
   (``benchmarks/bench_threads.py``, ``docs/benchmarks.md``): one process with 2 threads is
   faster than with 1 (toy ``train`` 0.76×, toy ``estimate`` 0.88× of the 1-thread wall), so
   a single command keeps torch's default; one thread per process pays only where processes
   share the cores.

:func:`apply` runs in :func:`recast_cli.cli.main` before any command imports torch, so the
choice reaches torch's intra-op pool and every child process (``accelerate launch``, study
recipes) through the environment.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping, MutableMapping, Optional

from recast_cli.errors import BadInput

ENV = "RECAST_THREADS"
USER_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_THREADS = 4096


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` is None where torch keeps its default (or the user's OMP/MKL setting)."""

    threads: Optional[int]
    reason: str


def choose(environ: Mapping[str, str]) -> ThreadChoice:
    """Apply the module's rule to an environment; no side effects."""
    value = environ.get(ENV, "").strip()
    if value and value.lower() != "auto":
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if not 1 <= threads <= MAX_THREADS:
            raise BadInput(f"{ENV}={value!r}: expected a positive integer (at most {MAX_THREADS}) or 'auto'")
        return ThreadChoice(threads, f"{ENV}={threads}")
    for name in USER_VARS:
        if environ.get(name, "").strip():
            return ThreadChoice(None, f"{name}={environ[name].strip()} (set by the user)")
    return ThreadChoice(None, "torch default")


def apply(environ: MutableMapping[str, str] = os.environ) -> ThreadChoice:
    """Choose, and write the choice into ``environ`` (and into torch, if it is already loaded)."""
    choice = choose(environ)
    if choice.threads is not None:
        for name in USER_VARS:
            environ[name] = str(choice.threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(choice.threads)
    return choice



def share_cores(processes: int, environ: MutableMapping[str, str] = os.environ,
                cores: Optional[int] = None) -> ThreadChoice:
    """Rule 3: ``processes`` processes run at once on this machine (``--shard i/n``): each gets
    max(1, cores // processes) threads, unless the user chose (rules 1–2) or there is one process.
    Written like :func:`apply` (the environment, and torch if it is loaded)."""
    choice = choose(environ)
    if processes <= 1 or choice.threads is not None or choice.reason != "torch default":
        return choice
    available = cores if cores is not None else (os.cpu_count() or 1)
    threads = max(1, available // processes)
    for name in USER_VARS:
        environ[name] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    return ThreadChoice(threads, f"{processes} shards share {available} cores")

"""How many CPU threads torch gets, chosen once before torch is imported.

The rule, first match wins:

1. ``RECAST_THREADS=N`` (a positive integer) — N threads; ``RECAST_THREADS=auto`` skips to 3.
2. ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` already set by the user — left as they are.
3. A machine with at most :data:`SMALL_MACHINE` CPUs — one thread per process. Measured on
   the 2-core machine (``benchmarks/bench_threads.py``, ``docs/benchmarks.md``): the toy and
   analytic models are so small that two threads mostly wait on each other, and ``make all
   JOBS=2`` runs two processes that would otherwise fight over both cores.
4. Otherwise torch's own default (one thread per physical core), which suits real models.

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
SMALL_MACHINE = 2
MAX_THREADS = 4096


@dataclass(frozen=True)
class ThreadChoice:
    """``threads`` is None where torch keeps its default (or the user's OMP/MKL setting)."""

    threads: Optional[int]
    reason: str


def choose(environ: Mapping[str, str], cpu_count: Optional[int]) -> ThreadChoice:
    """Apply the module's rule to an environment and a CPU count; no side effects."""
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
    if cpu_count is not None and cpu_count <= SMALL_MACHINE:
        return ThreadChoice(1, f"{cpu_count} CPUs: one thread per process")
    return ThreadChoice(None, "torch default")


def apply(environ: MutableMapping[str, str] = os.environ, cpu_count: Optional[int] = None) -> ThreadChoice:
    """Choose, and write the choice into ``environ`` (and into torch, if it is already loaded)."""
    choice = choose(environ, _cpus() if cpu_count is None else cpu_count)
    if choice.threads is not None:
        for name in USER_VARS:
            environ[name] = str(choice.threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(choice.threads)
    return choice


def _cpus() -> Optional[int]:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()

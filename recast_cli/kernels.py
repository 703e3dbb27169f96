"""The affinity kernels W is solved with (docs/method.md §5): one table, and every place that needs a kernel
reads it — the Sinkhorn solve (``solve/sinkhorn.log_affinity``), the line for a degenerate solve
(``solve/stage``), ``solve-w --kernel``'s help and check, a study's arms (``study/spec``) and W's reader
and metadata checks (``artifacts/weights``, ``artifacts/metadata``). A new kernel is one row of
:data:`KERNELS`: its name, its docs tag, its formula for messages, a phrase for ``--help``, and the
function from the mean-normalised gains ΔD̄ [m, T'] and τ to log K.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recast_cli.errors import BadInput, shown

#: E11p's floor: ΔD̄ below this fraction of its row's peak counts as that much (K > 0, log K finite).
POWER_FLOOR = 1e-6


@dataclass(frozen=True)
class Kernel:
    """One affinity kernel: ``log_affinity(ΔD̄, τ)`` is log K per reward and step (Sinkhorn sees K only
    through cross-ratios); ``tag`` the docs/method.md tag, ``form`` K as a formula, ``about`` what sets it
    apart (``--kernel``'s help)."""

    name: str
    tag: str
    form: str
    about: str
    log_affinity: Callable[[np.ndarray, float], np.ndarray]


def _exp(nbar: np.ndarray, tau: float) -> np.ndarray:
    """E11: log K_{i,t} = ΔD̄_{i,t} / τ (reads differences of gains)."""
    return nbar / tau


def _power(nbar: np.ndarray, tau: float) -> np.ndarray:
    """E11p: log K_{i,t} = log(ΔD̄_{i,t}) / τ, ΔD̄ floored at :data:`POWER_FLOOR` x its row's peak (reads
    ratios of gains: a row multiplied by a constant gives the same W)."""
    peak = nbar.max(axis=1, keepdims=True)
    return np.log(np.maximum(nbar, POWER_FLOOR * peak)) / tau


#: Every kernel, by the name ``--kernel``, a study arm and W's metadata give it.
KERNELS: dict[str, Kernel] = {
    "exp": Kernel("exp", "E11", "exp(ΔD̄/τ)", "the paper's", _exp),
    "power": Kernel("power", "E11p", "ΔD̄^(1/τ)", "blind to each gain row's scale", _power),
}
#: The kernel of ``solve-w`` and of a study arm that names none; a W written before W recorded its kernel
#: reads as this one.
DEFAULT_KERNEL = "exp"


def kernel_of(name: str, what: str = "--kernel") -> Kernel:
    """The kernel called ``name``; BadInput naming ``what`` and every kernel there is when there is none."""
    found = KERNELS.get(name) if isinstance(name, str) else None
    if found is None:
        raise BadInput(f"{what} must be one of {', '.join(KERNELS)}, got {shown(name)}")
    return found


def kernels_help() -> str:
    """The kernels as ``--kernel``'s help lists them: ``exp (E11, the paper's) | power (E11p: …)``."""
    return " | ".join(f"{k.name} ({k.tag}: K = {k.form}, {k.about})" for k in KERNELS.values())

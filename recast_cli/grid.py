"""σ grids in the paper's convention: ``sigmas[t]`` is σ_t for t = 0..T, σ_0 = 0, σ_T the noisiest.

A gain table records the family of the grid it was measured on (metadata ``grid``), so
``recast solve-w --steps T'`` can build the trainer's grid of T' steps from the same family
and resample the gains onto it (E9).

Families:
* ``linear``: σ_t = t / T (the analytic ``gmm1d`` world).
* ``flowmatch``: the grid of diffusers' ``FlowMatchEulerDiscreteScheduler(shift=S)`` after
  ``set_timesteps(T)`` (SD3 / SD3.5 with S = 3), reversed into the paper's order. The
  scheduler computes it in float32; so does this function, so the values agree exactly.
* ``dynamic``: the grid the FLUX.1 and Qwen-Image pipelines ask the same scheduler for:
  ``set_timesteps(sigmas=linspace(1, 1/T, T), mu=μ)`` — T levels spaced linearly from 1 to 1/T,
  time-shifted by μ (``exponential``: e^μ / (e^μ + (1/σ − 1)); ``linear``: μ / (μ + (1/σ − 1)))
  where the scheduler shifts dynamically (μ grows with the image's token count, so the grid
  depends on the resolution: the table records μ), else by the fixed ``shift``; then stretched
  so its last level is ``shift_terminal`` where the scheduler sets one (Qwen-Image: 0.02).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from recast_cli.errors import BadInput

GRID_KINDS = ("linear", "flowmatch", "dynamic")
TIME_SHIFTS = ("exponential", "linear")


@dataclass(frozen=True)
class GridSpec:
    kind: str
    shift: float = 1.0
    num_train_timesteps: int = 1000
    mu: float | None = None  # dynamic: the time shift μ (None: the fixed ``shift``)
    time_shift: str = "exponential"  # dynamic: how μ shifts σ
    shift_terminal: float | None = None  # dynamic: the last level before 0, where the scheduler stretches to one

    def sigmas(self, steps: int) -> np.ndarray:
        """σ_0 … σ_T of this family with T = ``steps``."""
        if steps < 1:
            raise BadInput(f"a grid needs at least 1 step, got {steps}")
        if self.kind == "linear":
            return np.arange(steps + 1, dtype=np.float64) / steps
        if self.kind == "dynamic":
            return dynamic_sigmas(steps, self.shift, self.mu, self.time_shift, self.shift_terminal)
        return flowmatch_sigmas(steps, self.shift, self.num_train_timesteps)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "linear":
            return {"kind": "linear"}
        if self.kind == "dynamic":
            return {"kind": self.kind, "shift": self.shift, "mu": self.mu, "time_shift": self.time_shift,
                    "shift_terminal": self.shift_terminal, "num_train_timesteps": self.num_train_timesteps}
        return {"kind": self.kind, "shift": self.shift, "num_train_timesteps": self.num_train_timesteps}

    def flags(self) -> str:
        """The ``recast solve-w`` flags that build this grid (`` --grid flowmatch --shift 3``)."""
        if self.kind == "linear":
            return " --grid linear"
        if self.kind == "flowmatch":
            return f" --grid flowmatch --shift {self.shift:g}"
        return " --grid dynamic" + (f" --mu {self.mu!r}" if self.mu is not None else f" --shift {self.shift:g}")

    def describe(self) -> str:
        """The grid in words (for messages): ``flowmatch, shift 3``, ``dynamic, μ 0.73 (exponential)``."""
        if self.kind == "linear":
            return "linear"
        if self.kind == "flowmatch":
            return f"flowmatch, shift {self.shift:g}"
        how = f"μ {self.mu:.6g} ({self.time_shift})" if self.mu is not None else f"shift {self.shift:g}"
        return f"dynamic, {how}" + (f", terminal {self.shift_terminal:g}" if self.shift_terminal else "")

    @classmethod
    def from_json(cls, value: Any, where: str = "grid") -> GridSpec:
        if not isinstance(value, dict) or value.get("kind") not in GRID_KINDS:
            raise BadInput(f"{where}: metadata 'grid' must be an object with kind one of {GRID_KINDS}")
        try:
            spec = cls(
                kind=value["kind"],
                shift=float(value.get("shift", 1.0)),
                num_train_timesteps=int(value.get("num_train_timesteps", 1000)),
                mu=None if value.get("mu") is None else float(value["mu"]),
                time_shift=str(value.get("time_shift", "exponential")),
                shift_terminal=None if value.get("shift_terminal") is None else float(value["shift_terminal"]),
            )
        except (TypeError, ValueError):
            raise BadInput(f"{where}: metadata 'grid' holds a value that is not a number") from None
        if not spec.shift > 0 or spec.num_train_timesteps < 1:
            raise BadInput(f"{where}: grid shift must be > 0 and num_train_timesteps >= 1")
        if spec.time_shift not in TIME_SHIFTS or (spec.shift_terminal is not None and not 0 <= spec.shift_terminal < 1) \
                or (spec.mu is not None and not np.isfinite(spec.mu)):
            raise BadInput(f"{where}: a dynamic grid needs a finite mu, time_shift one of {TIME_SHIFTS} and "
                           "shift_terminal in [0, 1)")
        return spec


def flowmatch_sigmas(steps: int, shift: float, num_train_timesteps: int = 1000) -> np.ndarray:
    """The shifted flow-matching schedule of diffusers' FlowMatchEulerDiscreteScheduler.

    The scheduler shifts its training sigmas once (σ_min = shift(1/N)), spaces T inference
    timesteps linearly between σ_max·N and σ_min·N, shifts those again and appends 0.
    """
    n = num_train_timesteps
    train = np.linspace(1, n, n, dtype=np.float32)[::-1] / np.float32(n)
    train = np.float32(shift) * train / (np.float32(1) + np.float32(shift - 1) * train)
    sigma_max, sigma_min = float(train[0]), float(train[-1])
    s = np.linspace(sigma_max * n, sigma_min * n, steps) / n
    s = (shift * s / (1 + (shift - 1) * s)).astype(np.float32)
    scheduler_order = np.concatenate([s, np.zeros(1, dtype=np.float32)])
    return scheduler_order[::-1].astype(np.float64)


def dynamic_sigmas(steps: int, shift: float = 1.0, mu: float | None = None, time_shift: str = "exponential",
                   shift_terminal: float | None = None) -> np.ndarray:
    """σ_0 … σ_T of ``FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=linspace(1, 1/T, T), mu=μ)``.

    What the FLUX.1 and Qwen-Image pipelines ask for, in the scheduler's float32 arithmetic
    (so the values agree exactly): μ given — the dynamic time shift; μ None — the fixed shift.
    """
    if shift_terminal and steps < 2:
        raise BadInput("a grid stretched to shift_terminal needs at least 2 steps (diffusers divides 0 by 0 at T = 1)")
    s = np.linspace(1.0, 1 / steps, steps).astype(np.float32)
    if mu is not None:
        scale = np.float32(mu) if time_shift == "linear" else np.float32(np.exp(mu))
        s = _time_shift(s, scale)
    else:
        s = np.float32(shift) * s / (np.float32(1) + np.float32(shift - 1) * s)
    if shift_terminal:
        one_minus = np.float32(1) - s
        s = np.float32(1) - one_minus / (one_minus[-1] / np.float32(1 - shift_terminal))
    scheduler_order = np.concatenate([s.astype(np.float32), np.zeros(1, dtype=np.float32)])
    return scheduler_order[::-1].astype(np.float64)


def _time_shift(s: np.ndarray, scale: np.float32) -> np.ndarray:
    """scale / (scale + (1/σ − 1)): the scheduler's time shift with e^μ (exponential) or μ (linear) as scale."""
    return scale / (scale + (np.float32(1) / s - np.float32(1)))

"""σ grids in the paper's convention: ``sigmas[t]`` is σ_t for t = 0..T, σ_0 = 0, σ_T the noisiest.

A gain table records the family of the grid it was measured on (metadata ``grid``), so
``recast solve-w --steps T'`` can build the trainer's grid of T' steps from the same family
and resample the gains onto it (E9).

Families:
* ``linear``: σ_t = t / T (the analytic ``gmm1d`` world).
* ``flowmatch``: the grid of diffusers' ``FlowMatchEulerDiscreteScheduler(shift=S)`` after
  ``set_timesteps(T)`` (SD3 / SD3.5 with S = 3), reversed into the paper's order. The
  scheduler computes it in float32; so does this function, so the values agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from recast_cli.errors import BadInput

GRID_KINDS = ("linear", "flowmatch")


@dataclass(frozen=True)
class GridSpec:
    kind: str
    shift: float = 1.0
    num_train_timesteps: int = 1000

    def sigmas(self, steps: int) -> np.ndarray:
        """σ_0 … σ_T of this family with T = ``steps``."""
        if steps < 1:
            raise BadInput(f"a grid needs at least 1 step, got {steps}")
        if self.kind == "linear":
            return np.arange(steps + 1, dtype=np.float64) / steps
        return flowmatch_sigmas(steps, self.shift, self.num_train_timesteps)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "linear":
            return {"kind": "linear"}
        return {"kind": self.kind, "shift": self.shift, "num_train_timesteps": self.num_train_timesteps}

    @classmethod
    def from_json(cls, value: Any, where: str = "grid") -> GridSpec:
        if not isinstance(value, dict) or value.get("kind") not in GRID_KINDS:
            raise BadInput(f"{where}: metadata 'grid' must be an object with kind one of {GRID_KINDS}")
        spec = cls(
            kind=value["kind"],
            shift=float(value.get("shift", 1.0)),
            num_train_timesteps=int(value.get("num_train_timesteps", 1000)),
        )
        if not spec.shift > 0 or spec.num_train_timesteps < 1:
            raise BadInput(f"{where}: grid shift must be > 0 and num_train_timesteps >= 1")
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

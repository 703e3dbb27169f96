"""``recast.weights/1``: the reward x step weight matrix W (E12), a safetensors file.

Tensor ``W`` float64 [m, T] (row i = reward i, column t-1 = step t) and tensor ``gain`` float64
[m, T] (the per-step gains on the same grid that W was solved from), string metadata (JSON
where structured). Optional tensors ``W_lo`` and ``W_hi`` [m, T]: the 5 % and 95 % points of each
entry over the W solved on every bootstrap draw of the gains (``solve-w --bootstrap``; absent in
files written before, or without draws).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from recast_cli.artifacts.io import Provenance, Source, atomic_write_bytes
from recast_cli.artifacts.jsonio import json_dumps, json_loads
from recast_cli.artifacts.metadata import check_weights_info, is_number
from recast_cli.artifacts.tables import check_finite, require_file, require_keys, require_schema
from recast_cli.errors import BadInput, shown
from recast_cli.kernels import DEFAULT_KERNEL, KERNELS  # the kernel table; re-exported for W's readers

WEIGHTS_SCHEMA = "recast.weights/1"

#: How W is made from the gains (E12): ``recast`` (Sinkhorn), the closed-form baselines ``nosink`` and
#: ``static``, and ``reversed`` (ReCAST's W with its columns in reverse step order).
MODES = ("recast", "nosink", "static", "reversed")
#: The temperature τ of the affinity kernel (E11, E11p) by default.
DEFAULT_TAU = 1.0

# --------------------------------------------------------------------------- weight matrix


@dataclass(frozen=True)
class WeightMatrix:
    """The reward x step weight matrix W (E12) with the gains it was solved from.

    ``W[i, t-1]`` is the weight of reward i at step t. ``trained_steps`` lists the steps the
    trainer trains (t ascending; None: all T): every other column is zero, rows sum to λ̂_i,
    and in modes ``recast`` and ``static`` every trained column sums to 1/T' (T' trained
    steps). ``sigmas`` runs σ_T … σ_0 (scheduler order). ``gain`` holds ΔD_{i,t} on this grid
    (after E9 resampling, before E10). ``kernel`` (one of :data:`KERNELS`) and ``tau`` are the
    affinity kernel's; a file written before W recorded its kernel reads as ``exp``. ``info``
    holds solver facts (iterations, marginal error, floor, indiscriminable rewards, spill shares).
    """

    W: np.ndarray
    gain: np.ndarray
    rewards: tuple[str, ...]
    lam: tuple[float, ...]
    mode: str
    tau: float
    sigmas: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None
    trained_steps: tuple[int, ...] | None = None
    kernel: str = DEFAULT_KERNEL
    band: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def T(self) -> int:
        return int(self.W.shape[1])

    @property
    def steps(self) -> tuple[int, ...]:
        """The trained steps t (ascending): ``trained_steps``, or every step 1 … T."""
        return tuple(range(1, self.T + 1)) if self.trained_steps is None else tuple(self.trained_steps)

    @property
    def skip_clean(self) -> int:
        """How many of the cleanest steps carry no weight (``solve-w --skip-clean``)."""
        return self.T - len(self.steps)

    @property
    def m(self) -> int:
        return int(self.W.shape[0])


def lambda_hat(lam: Sequence[float] | np.ndarray) -> np.ndarray:
    """λ̂ = λ / Σλ, the row sums of W (E12), computed as (λ / max λ) / Σ(λ / max λ) so that huge
    budgets do not overflow. The one definition: the solver balances rows to it, readers check them."""
    lam = np.asarray(lam, dtype=np.float64)
    scaled = lam / lam.max()
    return scaled / scaled.sum()


def validate_weights(w: WeightMatrix, where: str = "weight matrix") -> None:
    if w.W.ndim != 2 or w.W.shape[0] < 1 or w.W.shape[1] < 1:
        raise BadInput(f"{where}: tensor 'W' must have shape [m, T], got {list(w.W.shape)}")
    if w.W.dtype != np.float64:
        raise BadInput(f"{where}: tensor 'W' must be float64, got {w.W.dtype}")
    if w.gain.shape != w.W.shape:
        raise BadInput(f"{where}: tensor 'gain' has shape {list(w.gain.shape)}, expected {list(w.W.shape)}")
    check_finite("W", w.W, where, w.rewards)
    check_finite("gain", w.gain, where, w.rewards)
    if np.any(w.W < 0):
        raise BadInput(f"{where}: tensor 'W' has negative entries")
    if len(w.rewards) != w.m or len(set(w.rewards)) != w.m:
        raise BadInput(f"{where}: 'rewards' must name the {w.m} rows of W once each, got {list(w.rewards)}")
    if len(w.lam) != w.m or not all(math.isfinite(x) and x > 0 for x in w.lam):
        raise BadInput(f"{where}: 'lambda' must hold {w.m} positive numbers, got {list(w.lam)}")
    if w.mode not in MODES:
        raise BadInput(f"{where}: 'mode' must be one of {MODES}, got {w.mode!r}")
    if not (math.isfinite(w.tau) and w.tau > 0):
        raise BadInput(f"{where}: 'tau' must be a positive number, got {w.tau!r}")
    if w.kernel not in KERNELS:
        raise BadInput(f"{where}: 'kernel' must be one of {', '.join(KERNELS)}, got {shown(w.kernel)}")
    sig = np.asarray(w.sigmas, dtype=np.float64)
    if sig.shape != (w.T + 1,):
        raise BadInput(f"{where}: 'sigmas' must hold T + 1 = {w.T + 1} values, got {sig.size}")
    if not (np.all(np.isfinite(sig)) and np.all(np.diff(sig) < 0) and sig[-1] == 0.0):
        raise BadInput(f"{where}: 'sigmas' must run strictly down from σ_T to σ_0 = 0")
    check_marginals(w, where)
    if w.band is not None:
        for name, values in zip(("W_lo", "W_hi"), w.band):
            if np.shape(values) != w.W.shape:
                raise BadInput(f"{where}: tensor {name!r} has shape {list(np.shape(values))}, expected {list(w.W.shape)}")
            check_finite(name, np.asarray(values, dtype=np.float64), where, w.rewards)
            if np.any(np.asarray(values) < 0):
                raise BadInput(f"{where}: tensor {name!r} has negative entries")
        if np.any(w.band[0] > w.band[1]):
            raise BadInput(f"{where}: tensor 'W_lo' exceeds 'W_hi' somewhere")
    check_weights_info(w.info, w.rewards, w.T, KERNELS, where)


#: Tolerance of the marginals a W file must meet against its own metadata.
MARGINAL_TOL = 1e-8


def check_marginals(w: WeightMatrix, where: str = "weight matrix") -> None:
    """BadInput unless W agrees with its metadata (E12): rows sum to the recorded λ̂, the
    untrained columns are zero and, in modes ``recast``, ``static`` and ``reversed``, each trained column
    sums to 1/T' (all to ``MARGINAL_TOL``). A rescaled or relabelled tensor is refused."""
    steps = w.trained_steps
    if steps is not None:
        if (not steps or list(steps) != sorted(set(steps))
                or not all(isinstance(t, int) and 1 <= t <= w.T for t in steps)):
            raise BadInput(f"{where}: 'trained_steps' must list distinct steps of 1 … {w.T} in ascending order, "
                           f"got {list(steps)}")
    trained = np.array(w.steps) - 1
    untrained = np.setdiff1d(np.arange(w.T), trained)
    if untrained.size and np.any(w.W[:, untrained] != 0):
        raise BadInput(f"{where}: W puts weight on steps {[int(j) + 1 for j in untrained if w.W[:, j].any()]}, "
                       f"which its metadata says are not trained")
    lam_hat = lambda_hat(w.lam)
    rows = w.W.sum(axis=1)
    if np.max(np.abs(rows - lam_hat)) > MARGINAL_TOL:
        raise BadInput(f"{where}: the rows of W sum to {np.round(rows, 6).tolist()}, not to the recorded "
                       f"λ̂ = {np.round(lam_hat, 6).tolist()} (λ = {list(w.lam)})")
    if w.mode in ("recast", "static", "reversed"):
        cols = w.W[:, trained].sum(axis=0)
        target = 1.0 / len(trained)
        if np.max(np.abs(cols - target)) > MARGINAL_TOL:
            worst = int(trained[np.argmax(np.abs(cols - target))]) + 1
            raise BadInput(f"{where}: mode {w.mode!r} needs every trained column of W to sum to 1/T' = "
                           f"{target:.6g}; step {worst} sums to {float(w.W[:, worst - 1].sum()):.6g}")


def write_weights(path: str | os.PathLike[str], w: WeightMatrix, *, config: Mapping[str, Any] | None = None,
                  sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``w`` and write it atomically as a ``recast.weights/1`` safetensors file."""
    validate_weights(w)
    provenance = Provenance.new(WEIGHTS_SCHEMA, config, sources)
    meta = provenance.to_metadata()
    metadata = {
        "schema": WEIGHTS_SCHEMA,
        "recast_version": provenance.recast_version,
        "created_at": provenance.created_at,
        "config": json_dumps(meta["config"]),
        "sources": json_dumps(meta["sources"]),
        "rewards": json_dumps(list(w.rewards)),
        "lambda": json_dumps([float(x) for x in w.lam]),
        "mode": w.mode,
        "tau": json_dumps(float(w.tau)),
        "kernel": json_dumps(w.kernel),  # JSON like tau, so an older recast reads the file
        "T": json_dumps(w.T),
        "sigmas": json_dumps([float(s) for s in w.sigmas]),
        "info": json_dumps(w.info),
    }
    if w.trained_steps is not None:
        metadata["trained_steps"] = json_dumps([int(t) for t in w.trained_steps])
    tensors = {"W": np.ascontiguousarray(w.W, dtype=np.float64), "gain": np.ascontiguousarray(w.gain, dtype=np.float64)}
    if w.band is not None:
        tensors["W_lo"], tensors["W_hi"] = (np.ascontiguousarray(b, dtype=np.float64) for b in w.band)
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))
    return provenance


def read_weights(path: str | os.PathLike[str]) -> WeightMatrix:
    """Read and validate a ``recast.weights/1`` safetensors file."""
    p = Path(path)
    where = str(p)
    require_file(p)
    data = p.read_bytes()
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json_loads(data[8 : 8 + header_len], f"{where}: header")
    except (SafetensorError, ValueError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{where}: not a readable safetensors file ({first})") from None
    raw = header.get("__metadata__") or {}
    require_schema(raw, WEIGHTS_SCHEMA, where)
    required = ("rewards", "lambda", "mode", "tau", "T", "sigmas", "sources", "config",
                "recast_version", "created_at")
    require_keys(raw, required, where)
    meta: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("schema", "mode", "recast_version", "created_at"):
            meta[key] = value
            continue
        try:
            meta[key] = json_loads(value, f"{where}: metadata {key!r}")
        except json.JSONDecodeError:
            raise BadInput(f"{where}: metadata {key!r} is not JSON") from None
    for name in ("W", "gain"):
        if name not in tensors:
            raise BadInput(f"{where}: no tensor {name!r}")
    if meta["T"] != tensors["W"].shape[-1]:
        raise BadInput(f"{where}: metadata T = {meta['T']} but W has {tensors['W'].shape[-1]} columns")
    numbers = [meta["tau"]] + [x for key in ("lambda", "sigmas") if isinstance(meta[key], list) for x in meta[key]]
    if not (isinstance(meta["lambda"], list) and isinstance(meta["sigmas"], list) and all(map(is_number, numbers))):
        raise BadInput(f"{where}: metadata 'lambda' and 'sigmas' must be lists of numbers, 'tau' a number")
    lam = tuple(float(x) for x in meta["lambda"])
    sigmas = np.asarray(meta["sigmas"], dtype=np.float64)
    tau = float(meta["tau"])
    if not isinstance(meta["rewards"], list) or not all(isinstance(r, str) for r in meta["rewards"]):
        raise BadInput(f"{where}: metadata 'rewards' must be a list of reward names, got {shown(meta['rewards'])}")
    trained_steps = meta.get("trained_steps")
    if trained_steps is not None:
        if not isinstance(trained_steps, list) or not all(type(t) is int for t in trained_steps):
            raise BadInput(f"{where}: metadata 'trained_steps' must be a list of step numbers")
        trained_steps = tuple(trained_steps)
    w = WeightMatrix(
        W=tensors["W"],
        gain=tensors["gain"],
        rewards=tuple(meta["rewards"]),
        lam=lam,
        mode=meta["mode"],
        tau=tau,
        sigmas=sigmas,
        info=meta.get("info", {}),
        provenance=Provenance.from_metadata(meta, where),
        trained_steps=trained_steps,
        kernel=meta.get("kernel", DEFAULT_KERNEL),
        band=_band(tensors, where),
    )
    validate_weights(w, where)
    return w


def _band(tensors: Mapping[str, np.ndarray], where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The optional bootstrap band (``W_lo``, ``W_hi``): both tensors or neither."""
    if "W_lo" not in tensors and "W_hi" not in tensors:
        return None
    if not ("W_lo" in tensors and "W_hi" in tensors):
        raise BadInput(f"{where}: tensors 'W_lo' and 'W_hi' come together (the bootstrap band of W); one is missing")
    for name in ("W_lo", "W_hi"):
        if tensors[name].dtype != np.float64:
            raise BadInput(f"{where}: tensor {name!r} must be float64, got {tensors[name].dtype}")
    return tensors["W_lo"], tensors["W_hi"]

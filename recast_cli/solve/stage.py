"""The ``solve-w`` stage: a gain table and budgets λ in, a ``recast.weights/1`` matrix out.

Top to bottom: read the gains, parse λ against the table's rewards, move the gains to the
training grid when it differs (E9), solve (E10-E12, or a baseline mode), measure the spill
(docs/method.md §5), write the artifact.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from recast_cli.artifacts import (MODES, WEIGHTS_SCHEMA, GainTable, Source, WeightMatrix, claim_output, read_gains,
                                  write_weights)
from recast_cli.artifacts.weights import DEFAULT_TAU
from recast_cli.kernels import DEFAULT_KERNEL, kernel_of
from recast_cli import bounds
from recast_cli.errors import BadInput, shown
from recast_cli.grid import GRID_KINDS, GridSpec
from recast_cli.solve.conflict import conflicts_on_grid, settled_by_timing
from recast_cli.solve.sinkhorn import (DEFAULT_FLOOR, SinkhornError, SinkhornResult, Solution, conflict_static_weights,
                                       lambda_hat, log_affinity, marginal_error, resample_gains, solve_weights, spill_share,
                                       uncertainty_shrinkage, uncertainty_shrunk_weights)
from recast_cli.solve.uncertainty import bootstrap_weights, quantile_band, row_uncertainty, samples_for_spread

#: The largest ratio between two budgets: beyond it λ̂ of the smallest is lost to rounding.
MAX_LAMBDA_RATIO = 1e12


def parse_lambda(text: str, rewards: tuple[str, ...]) -> np.ndarray:
    """λ from ``"1,1,2"`` (the table's reward order) or ``"clip=1,ocr=2"`` (by name).

    By name, every reward not named keeps the default budget 1.
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise BadInput(f"--lambda {text!r}: expected comma-separated numbers or name=number pairs")
    named = ["=" in p for p in parts]
    if any(named) and not all(named):
        raise BadInput(f"--lambda {text!r}: give every value by position or every value by name, not both")

    def number(raw: str, label: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise BadInput(f"--lambda: {label} {raw!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise BadInput(f"--lambda: {label} must be a positive finite number, got {raw!r}")
        return value

    if not all(named):
        if len(parts) != len(rewards):
            raise BadInput(f"--lambda has {len(parts)} values but the gain table has {len(rewards)} rewards "
                           f"({', '.join(rewards)})")
        return np.array([number(p, f"value for {r!r}") for p, r in zip(parts, rewards)])
    lam = dict.fromkeys(rewards, 1.0)
    given: set[str] = set()
    for part in parts:
        name, raw = (s.strip() for s in part.split("=", 1))
        if name not in lam:
            raise BadInput(f"--lambda: unknown reward {name!r}; the gain table has {', '.join(rewards)}")
        if name in given:
            raise BadInput(f"--lambda: reward {name!r} is given twice")
        given.add(name)
        lam[name] = number(raw, f"value for {name!r}")
    return np.array(list(lam.values()))


@dataclass(frozen=True)
class SolveReport:
    """The written matrix and what a user should be told about it."""

    weights: WeightMatrix
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Budgets:
    """λ given with where it came from, recorded in W as ``lambda_from``: ``text`` as ``--lambda`` takes it,
    or ``values`` by reward name (a setting's ``[train] lambda``), which must name exactly the gain table's
    rewards; ``source`` says which (``[train] lambda of S.toml``, or ``--lambda`` over it)."""

    source: str
    text: str | None = None
    values: Mapping[str, float] | None = None


def solve_w(gains: str | os.PathLike[str], lam_text: str | Budgets, out: str | os.PathLike[str], *,
            mode: str = "recast",
            tau: float = DEFAULT_TAU, steps: int | None = None, grid: str | None = None, shift: float | None = None,
            floor: float = DEFAULT_FLOOR, skip_clean: int = 0,
            mu: float | None = None, kernel: str = DEFAULT_KERNEL, shrink: float | str = 1.0,
            bootstrap: int | None = None, conflicts: str = "keep",
            conflicts_from: str | os.PathLike[str] | None = None) -> SolveReport:
    """Solve W from a gain table and write it to ``out`` atomically (nothing is written on bad input).
    ``lam_text`` is ``--lambda``'s text, or :class:`Budgets` (a setting's ``[train] lambda``, or ``--lambda``
    over it), whose source W records.

    ``skip_clean`` = K leaves the K cleanest steps untrained: they get W = 0 and the solve runs
    over the other T' = T − K columns (rows λ̂, trained columns 1/T'), as the trainer needs.
    ``shrink`` = γ < 1 writes (1 − γ)·static + γ·W (E12s), recorded as ``info.shrink``; ``"auto"`` pulls
    each row toward static by its own bootstrap spread (E12u). ``bootstrap`` = B solves W again on the first
    B of the table's bootstrap draws (None: all of them, when the table has any; 0: none) and records each
    row's spread and verdict (``info.bootstrap``). ``conflicts`` = ``static`` keeps static weights on the
    steps where two rewards conflict (E12c, E14); the conflicts found are recorded either way. They are read
    from the gain table, or from ``conflicts_from``: another table of the same rewards whose rollouts pair them
    (e.g. a π^old-sampling estimate, where the π⁺ one used a positive set per reward).
    """
    _check_options(mode=mode, kernel=kernel, tau=tau, steps=steps, skip_clean=skip_clean, floor=floor, grid=grid,
                   shift=shift, mu=mu, shrink=shrink, bootstrap=bootstrap, conflicts=conflicts)
    out_path = claim_output(out, WEIGHTS_SCHEMA, inputs=[gains] + ([conflicts_from] if conflicts_from else []))
    table = read_gains(gains)
    lam = _budgets(lam_text, table.rewards)
    spec, sigmas = _solve_grid(table, gains, steps=steps, grid=grid, shift=shift, mu=mu)

    def on_grid(values: np.ndarray) -> np.ndarray:
        return values if np.array_equal(sigmas, table.sigmas) else resample_gains(table.sigmas, values, sigmas)

    gain = on_grid(table.gain)
    T = len(sigmas) - 1
    if skip_clean >= T:
        raise BadInput(f"--skip-clean {skip_clean} leaves no trained step on a T = {T} grid (use 0 … {T - 1})")
    draws = _draws(table, bootstrap, gains, mode=mode, shrink=shrink)
    found = _found_conflicts(table, gains, conflicts_from, conflicts, sigmas)
    noise = None if table.D_lo is None or table.D_hi is None else (table.D_hi[:, 0] - table.D_lo[:, 0]) / 2
    gamma = shrink if isinstance(shrink, float) else 1.0
    solution = _solve(gain, lam, mode=mode, tau=tau, floor=floor, noise=noise, skip_clean=skip_clean, kernel=kernel,
                      shrink=gamma)
    trained = slice(skip_clean, T)
    info_extra: dict[str, Any] = {}
    band = draws_W = None
    if draws is not None:  # W solved again on every draw, exactly as the point W
        draws_W = bootstrap_weights(draws, lambda draw: _solve(
            on_grid(draw), lam, mode=mode, tau=tau, floor=floor, noise=noise, skip_clean=skip_clean, kernel=kernel,
            shrink=gamma).W)
        rows = row_uncertainty(solution.W[:, trained], draws_W[:, :, trained], lam, _samples(table))
        info_extra["bootstrap"], band = _bootstrap_info(table, rows, len(draws)), quantile_band(draws_W)
    W = solution.W
    if shrink == "auto":
        W, info_extra["variant"] = _shrunk_by_spread(W, draws_W, lam, table.rewards, trained)
    if conflicts == "static":
        W, info_extra["variant"] = _static_on_conflicts(W, solution, lam, found, trained, tau=tau, kernel=kernel)
    warnings = _indiscriminable(table.rewards, solution, gain[:, skip_clean:].sum(axis=1), floor=floor,
                                with_noise=noise is not None)
    info_extra["conflicts"] = [c.to_json() for c in found]
    info_extra["settled_by_timing"] = settled_by_timing(W, table.rewards, found)
    error = None if W is solution.W else marginal_error(W[:, trained], lambda_hat(lam),
                                                        np.full(T - skip_clean, 1.0 / (T - skip_clean)))
    info = _solve_info(solution, table, gain, floor=floor, skip_clean=skip_clean, kernel=kernel, shrink=gamma, W=W,
                       error=error)
    weights = WeightMatrix(W=W, gain=gain, rewards=table.rewards, lam=tuple(float(x) for x in lam), mode=mode, tau=tau,
                           sigmas=sigmas[::-1].copy(), info={**info, **info_extra},
                           trained_steps=tuple(range(skip_clean + 1, T + 1)), kernel=kernel, band=band)
    config = {"command": "solve-w", "lambda": [float(x) for x in lam], "mode": mode, "tau": tau, "steps": steps,
              "grid": spec.to_json() if spec else None, "floor": floor, "skip_clean": skip_clean, "kernel": kernel}
    # each recorded only when used: a W solved without it is the same file as before
    optional = {"lambda_from": lam_text.source if isinstance(lam_text, Budgets) else None,
                "shrink": shrink if shrink != 1.0 else None, "bootstrap": len(draws) if draws is not None else None,
                "conflicts": conflicts if conflicts != "keep" else None,
                "conflicts_from": str(conflicts_from) if conflicts_from is not None else None}
    config.update({key: value for key, value in optional.items() if value is not None})
    sources = [Source.of(gains)] + ([Source.of(conflicts_from)] if conflicts_from is not None else [])
    provenance = write_weights(out_path, weights, config=config, sources=sources)
    return SolveReport(weights=replace(weights, provenance=provenance), warnings=warnings)


def _solve_grid(table: GainTable, gains: object, *, steps: int | None, grid: str | None, shift: float | None,
                mu: float | None) -> tuple[GridSpec | None, np.ndarray]:
    """(the grid spec, σ_T … σ_0) W is solved on: the table's own, or the grid the flags name (E9)."""
    if steps is None and grid is None and shift is None and mu is None:
        return None, table.sigmas
    spec = _target_grid(table.meta.get("grid"), grid, shift, gains, mu)
    return spec, spec.sigmas(steps if steps is not None else table.T)


def _found_conflicts(table: GainTable, gains: object, conflicts_from: object, conflicts: str,
                     sigmas: np.ndarray) -> list:
    """E14's conflicts on W's grid, from the gain table or ``--conflicts-from`` (the same rewards); BadInput when
    a flag asks for correlations the table does not record."""
    pairing, pairing_path = (table, gains) if conflicts_from is None else (read_gains(conflicts_from), conflicts_from)
    if set(pairing.rewards) != set(table.rewards):
        raise BadInput(f"--conflicts-from {pairing_path}: its rewards ({', '.join(pairing.rewards)}) are not the gain "
                       f"table's ({', '.join(table.rewards)})")
    corr = pairing.meta.get("advantage_corr")
    if corr is None and (conflicts == "static" or conflicts_from is not None):  # else the flag would do nothing
        flag = "--conflicts static" if conflicts_from is None else "--conflicts-from"
        raise BadInput(f"{flag}: {pairing_path} records no advantage correlations (E14): it is exact, "
                       "a recast.gains/1 table, estimated with K = 1, or its rewards were scored on rollouts of their "
                       "own (a π⁺ positive set per reward); give a π^old-sampling estimate with --conflicts-from "
                       "(recast estimate --sampling pold)")
    return conflicts_on_grid(corr, pairing.sigmas, sigmas)


def _shrunk_by_spread(W: np.ndarray, draws_W: np.ndarray, lam: np.ndarray, rewards: tuple[str, ...],
                      trained: slice) -> tuple[np.ndarray, dict]:
    """E12u: each row pulled toward static by its bootstrap spread; W and its ``info.variant``."""
    g = uncertainty_shrinkage(W[:, trained], draws_W[:, :, trained])
    W = _balanced(W, uncertainty_shrunk_weights(W[:, trained], lam, g), trained)
    return W, {"name": "uncertainty-shrunk", "tag": "E12u", "gamma": {r: float(x) for r, x in zip(rewards, g)}}


def _static_on_conflicts(W: np.ndarray, solution: Solution, lam: np.ndarray, found: list, trained: slice, *,
                         tau: float, kernel: str) -> tuple[np.ndarray, dict]:
    """E12c: static weights on the trained steps where two rewards conflict; W and its ``info.variant``."""
    skip_clean = trained.start
    columns = np.zeros(trained.stop - skip_clean, dtype=bool)
    for c in found:
        columns[[t - 1 - skip_clean for t in c.steps if t > skip_clean]] = True
    log_k = log_affinity(solution.normalised_gain[:, trained], tau, kernel)
    W = _balanced(W, _guard(lambda: conflict_static_weights(log_k, lam, columns), tau, kernel), trained)
    return W, {"name": "conflict-aware", "tag": "E12c",
               "static_steps": [int(t) + 1 + skip_clean for t in np.nonzero(columns)[0]]}


def _draws(table: GainTable, bootstrap: int | None, where: object, *, mode: str,
           shrink: float | str) -> np.ndarray | None:
    """The bootstrap draws W is solved again on: the first ``bootstrap`` of the table's (None: all; 0: none).
    None for a static W (no draw moves it) unless asked for by number; BadInput when asked for and absent."""
    needed = shrink == "auto"
    if bootstrap == 0:
        if needed:
            raise BadInput("--shrink auto pulls each row toward static by its bootstrap spread: it needs "
                           "--bootstrap above 0")
        return None
    if table.gain_draws is None:
        if bootstrap is None and not needed:
            return None
        what = "--shrink auto" if needed else f"--bootstrap {bootstrap}"
        raise BadInput(f"{what}: {where} records no bootstrap draws (an exact table, a recast.gains/1 table, or "
                       "estimated with --bootstrap 0 or one prompt); re-estimate, or rewrite it from its scores: "
                       "recast estimate --from-scores SCORES --out GAINS")
    if mode == "static" and bootstrap is None:
        return None
    available = table.gain_draws.shape[0]
    if bootstrap is not None and bootstrap > available:
        raise BadInput(f"--bootstrap {bootstrap}: {where} holds {available} draws; use at most {available}")
    return table.gain_draws[: bootstrap or available]


def _samples(table: GainTable) -> int | None:
    """N, the positives per prompt of a sampled estimate (None: an exact table, no budget line)."""
    n = table.meta.get("N")
    return int(n) if table.meta.get("sampling") != "exact" and type(n) is int and n > 0 else None


def _bootstrap_info(table: GainTable, rows: list, draws: int) -> dict[str, Any]:
    """``info.bootstrap``: the draws, each reward's spread and verdict, and the samples per prompt that the
    widest row would need for a median TV of 0.1 and of 0.05 (docs/trust.md)."""
    samples = _samples(table)
    budget = None
    if samples is not None:
        budget = {str(target): samples_for_spread(rows, samples, target) for target in TV_TARGETS}
    return {"draws": draws, "samples": samples, "P": table.meta.get("P"), "K": table.meta.get("K"),
            "rows": {r: row.to_json() for r, row in zip(table.rewards, rows)}, "samples_for_tv": budget}


#: the median row TVs the budget line states the samples per prompt for
TV_TARGETS = (0.1, 0.05)


def _balanced(W: np.ndarray, result: SinkhornResult, trained: slice) -> np.ndarray:
    """W with its trained columns replaced by a variant's (the untrained ones stay 0)."""
    out = np.zeros_like(W)
    out[:, trained] = result.W
    return out


def _guard(solve: Callable[[], SinkhornResult], tau: float, kernel: str) -> SinkhornResult:
    """A solve with every numeric failure turned into one line: it comes from the inputs (gains, λ, τ), so it is
    BadInput (exit 2), never a numpy warning or a traceback."""
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            return solve()
    except (SinkhornError, FloatingPointError):
        form = kernel_of(kernel).form
        raise BadInput(f"--tau {tau:g} is too small for these gains: the kernel {form} is degenerate and "
                       f"Sinkhorn cannot balance it; use a larger --tau (default {DEFAULT_TAU:g})") from None


def _check_options(*, mode: str, kernel: str, tau: float, steps: int | None, skip_clean: int, floor: float,
                   grid: str | None, shift: float | None, mu: float | None, shrink: float | str = 1.0,
                   bootstrap: int | None = None, conflicts: str = "keep") -> None:
    """BadInput for a solve-w option out of its range, before any file is claimed or read."""
    if mode not in MODES:
        raise BadInput(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    kernel_of(kernel)
    if not (math.isfinite(tau) and tau > 0):
        raise BadInput(f"--tau must be a positive number, got {tau!r}")
    bounds.check_all(("steps", "--steps", steps), ("skip_clean", "--skip-clean", skip_clean))
    if not (math.isfinite(floor) and 0 <= floor < 1):
        raise BadInput(f"--floor must lie in [0, 1), got {floor!r}")
    if grid is not None and grid not in GRID_KINDS:
        raise BadInput(f"--grid must be one of {', '.join(GRID_KINDS)}, got {grid!r}")
    if shift is not None and not (math.isfinite(shift) and shift > 0):
        raise BadInput(f"--shift must be a positive number, got {shift!r}")
    if mu is not None and not math.isfinite(mu):
        raise BadInput(f"--mu must be a finite number, got {mu!r}")
    if shrink != "auto" and not (isinstance(shrink, float) and math.isfinite(shrink) and 0 < shrink <= 1):
        raise BadInput(f"--shrink must lie in (0, 1] (1: W as solved) or be auto (E12u), got {shown(shrink)}")
    if bootstrap is not None:
        bounds.check("bootstrap", bootstrap, "--bootstrap")
        if bootstrap == 1:  # the band, each row's verdict and E12u's shares would all read a spread of zero
            raise BadInput("--bootstrap 1: one draw measures no spread (W's band, each row's verdict and --shrink "
                           "auto need at least 2); give 0 (none) or 2 and more")
    if conflicts not in CONFLICT_CHOICES:
        raise BadInput(f"--conflicts must be one of {', '.join(CONFLICT_CHOICES)}, got {shown(conflicts)}")
    if (shrink == "auto" or conflicts == "static") and mode != "recast":
        variant = "--shrink auto" if shrink == "auto" else "--conflicts static"
        raise BadInput(f"{variant} is a variant of ReCAST's W: it needs --mode recast, not {mode}")
    if shrink == "auto" and conflicts == "static":
        raise BadInput("--shrink auto and --conflicts static are two variants of W; choose one")


#: what ``--conflicts`` may say: keep W as solved on conflicting steps, or give them static weights (E12c)
CONFLICT_CHOICES = ("keep", "static")


def parse_shrink(text: str) -> float | str:
    """``--shrink``: a share γ as a number, or ``auto`` (E12u); BadInput for anything else."""
    if text.strip() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise BadInput(f"--shrink must be a number in (0, 1] or auto, got {shown(text)}") from None


def _budgets(lam_text: str | Budgets, rewards: tuple[str, ...]) -> np.ndarray:
    """λ of ``--lambda`` (:func:`parse_lambda`) or of a setting's ``[train] lambda`` (:class:`Budgets`: every
    reward of the gain table, no other), refused when the budgets span more than ``MAX_LAMBDA_RATIO``."""
    if isinstance(lam_text, Budgets) and lam_text.values is not None:
        given = dict(lam_text.values)
        if set(given) != set(rewards):
            raise BadInput(f"{lam_text.source}: it gives budgets for {', '.join(given)}, the gain table has the "
                           f"rewards {', '.join(rewards)}; give --lambda, or a setting of these rewards")
        lam = np.array([float(given[name]) for name in rewards])
    else:
        lam = parse_lambda(lam_text.text if isinstance(lam_text, Budgets) else lam_text, rewards)
    if np.log10(lam.max()) - np.log10(lam.min()) > np.log10(MAX_LAMBDA_RATIO):
        raise BadInput(f"--lambda: the budgets span more than {MAX_LAMBDA_RATIO:g}x (largest {lam.max():g}, smallest "
                       f"{lam.min():g}); the smallest would get no weight: give them on a common scale")
    return lam


def _solve(gain: np.ndarray, lam: np.ndarray, *, mode: str, tau: float, floor: float, noise: np.ndarray | None,
           skip_clean: int, kernel: str, shrink: float = 1.0) -> SinkhornResult:
    """``solve_weights`` with every numeric failure turned into one line (``_guard``)."""
    return _guard(lambda: solve_weights(gain, lam, mode=mode, tau=tau, floor=floor, noise=noise,
                                        skip_clean=skip_clean, kernel=kernel, shrink=shrink), tau, kernel)


def _indiscriminable(rewards: tuple[str, ...], solution: SinkhornResult, totals: np.ndarray, *, floor: float,
                     with_noise: bool) -> list[str]:
    """One warning per reward the solve found indiscriminable (its ``totals`` gain on the trained steps
    below the floor, or below its bootstrap noise ``with_noise``): its row of W is uniform."""
    return [
        f"reward {name!r} is indiscriminable (total gain {totals[i]:.3g} is below the floor "
        f"{floor:g} x the largest total{' or its bootstrap noise' if with_noise else ''}); "
        f"its row of W is uniform"
        for i, name in enumerate(rewards) if solution.indiscriminable[i]
    ]


def _solve_info(solution: SinkhornResult, table: GainTable, gain: np.ndarray, *, floor: float, skip_clean: int,
                kernel: str, shrink: float = 1.0, W: np.ndarray | None = None,
                error: float | None = None) -> dict[str, Any]:
    """What W's ``info`` records of the solve: Sinkhorn's iterations and error, the indiscriminable rewards,
    each reward's spill share on the trained steps (docs/method.md §5) of the W written (``W``: a variant's),
    and whether the gains were resampled."""
    W = solution.W if W is None else W
    spill = spill_share(W[:, skip_clean:], gain[:, skip_clean:])
    return {
        "iterations": solution.iterations,
        "marginal_error": solution.error if error is None else error,
        "floor": floor,
        "indiscriminable": [r for r, low in zip(table.rewards, solution.indiscriminable) if low],
        "spill_share": {r: (None if math.isnan(s) else float(s)) for r, s in zip(table.rewards, spill)},
        "source_T": table.T,
        "resampled": gain is not table.gain,
        "kernel": kernel,
        **({"shrink": shrink} if shrink != 1.0 else {}),  # E12s; absent: W as solved
    }


def static_matrix(rewards: tuple[str, ...], lam: tuple[float, ...], sigmas_desc: np.ndarray, skip_clean: int,
                  info: dict[str, Any]) -> WeightMatrix:
    """The static W of a run as a matrix artifact, from no gain table (``recast train --weights static``).

    ``solve_weights``' static mode, the one that ``solve-w --mode static`` runs: W_{i,t} = λ̂_i / T' on
    the T' = T − ``skip_clean`` trained steps, 0 on the cleanest ``skip_clean``; ``sigmas_desc`` runs
    σ_T … σ_0 (the sampler's grid) and ``gain`` is zero (nothing was measured).
    """
    T = len(sigmas_desc) - 1
    gain = np.zeros((len(lam), T))
    W = solve_weights(gain, np.asarray(lam, dtype=np.float64), mode="static", skip_clean=skip_clean).W
    return WeightMatrix(W=W, gain=gain, rewards=rewards, lam=tuple(float(x) for x in lam), mode="static",
                        tau=DEFAULT_TAU, sigmas=np.asarray(sigmas_desc, dtype=np.float64), info=info,
                        trained_steps=tuple(range(skip_clean + 1, T + 1)), kernel=DEFAULT_KERNEL)


def _target_grid(recorded: object, kind: str | None, shift: float | None, where: object,
                 mu: float | None = None) -> GridSpec:
    """The grid family to solve on: the table's recorded family, with --grid/--shift/--mu overriding it."""
    if recorded is None and kind is None:
        raise BadInput(f"{where}: the gain table records no grid family; pass --grid {'|'.join(GRID_KINDS)}")
    base = GridSpec.from_json(recorded, str(where)) if recorded is not None else None
    kind = kind or base.kind
    if mu is not None and kind != "dynamic":
        raise BadInput("--mu applies to the dynamic grid (FLUX, Qwen-Image), not the " + kind + " one")
    if kind == "linear":
        if shift is not None:
            raise BadInput("--shift applies to the flowmatch and dynamic grids, not the linear one")
        return GridSpec("linear")
    if kind == "dynamic":
        if base is None or base.kind != "dynamic":
            raise BadInput(f"--grid dynamic needs a gain table measured on a dynamic grid (FLUX, Qwen-Image): its "
                           f"time shift and terminal come from there; {where} records "
                           f"{base.describe() if base else 'none'}")
        if shift is not None and mu is not None:
            raise BadInput("--shift and --mu: a dynamic grid is shifted by one of them (μ where the scheduler "
                           "shifts dynamically)")
        if mu is not None:
            return replace(base, mu=mu)
        return base if shift is None else replace(base, mu=None, shift=shift)
    if shift is None and (base is None or base.kind != "flowmatch"):
        raise BadInput("--grid flowmatch needs --shift (SD3 / SD3.5 use 3.0)")
    recorded_flow = base if base is not None and base.kind == "flowmatch" else GridSpec("flowmatch")
    return GridSpec("flowmatch", shift if shift is not None else recorded_flow.shift,
                    recorded_flow.num_train_timesteps)

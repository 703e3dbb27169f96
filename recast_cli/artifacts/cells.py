"""``recast.cell/1``: one study cell of the 1-D world — S seeds of one (arm, budget, group size) trained
by the batched engine (``recast study``), one Parquet row per (seed, step, phase, quantity).

``phase`` is ``sde`` or ``ode`` for an evaluation of the seed's policy at a checkpoint (``quantity``
a reward or ``aggregate``; ``value`` the mean over the cell's n evaluation samples, ``std`` their
std), and ``train`` for a training iteration (``quantity`` one of :data:`TRAIN_QUANTITIES` or
``reward/NAME``, the batch mean of a reward, or ``reward_spread/NAME``, its within-group std pooled
over the groups — cell format 3 on; ``std`` null). Everything else — the arm, λ, W, the recipe, the evaluation's n
and seeds, the first iteration's gradient statistics — is in the metadata.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recast_cli.artifacts.curve import CURVE_SAMPLERS, CurveTable
from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source
from recast_cli.artifacts.jsonio import json_dumps
from recast_cli.artifacts.tables import check_finite, open_parquet, require_columns, require_keys, write_parquet
from recast_cli.errors import BadInput

CELL_SCHEMA = "recast.cell/1"
CELL_COLUMNS: dict[str, pa.DataType] = {
    "seed": pa.int64(),
    "step": pa.int64(),
    "phase": pa.string(),
    "quantity": pa.string(),
    "value": pa.float64(),
    "std": pa.float64(),
}
#: What every training row records besides ``reward/NAME`` (the batch mean of each reward).
TRAIN_QUANTITIES = ("aggregate", "policy_loss", "kl", "clip_frac", "loss", "grad_norm")
#: The version of what a cell holds for given inputs (the batched engine's computation and the table):
#: raised whenever the same setting, W and seeds would give other numbers, so that ``recast study``
#: never reuses a cell an older recast computed otherwise.
CELL_FORMAT = 3  # 3: the base policy's evaluation, each reward's range and gradient signal-to-noise
#: The report's lost reward (issue 42): a reward whose final ODE value closes less than this share of the
#: gap between the base policy's value and the reward's ceiling (``[study] lost_delta``).
DEFAULT_LOST_DELTA = 0.25
#: The metadata key of the digest of each input that determined the cell (``recast study``'s reuse check).
MADE_FROM = "made_from"
#: What a cell's metadata must say.
CELL_KEYS = ("setting", "arm", "mode", "kernel", "gains", "lambda", "rewards", "group_size", "prompts_per_step",
             "n", "eval_seed", "W", "weights_key", "gradient")


@dataclass(frozen=True)
class CellTable:
    """One cell: ``evals`` [S, K, m + 1] means (and ``eval_std``) at the (step, sampler) ``points`` of every
    seed (scorers: the rewards, then ``aggregate``); ``train`` quantity → [S, steps] per iteration."""

    seeds: tuple[int, ...]
    rewards: tuple[str, ...]
    points: tuple[tuple[int, str], ...]
    evals: np.ndarray
    eval_std: np.ndarray
    steps: tuple[int, ...]
    train: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def scorers(self) -> tuple[str, ...]:
        return (*self.rewards, "aggregate")

    @property
    def label(self) -> str:
        return str(self.meta["arm"])

    def curve(self, seed: int) -> CurveTable:
        """Seed ``seed``'s evaluations as the ``recast.curve/1`` table ``recast evaluate`` would write for its run."""
        s = self.seeds.index(seed)
        meta = self.meta
        return CurveTable(points=self.points, scorers=self.scorers, n=int(meta["n"]), mean=self.evals[s],
                          std=self.eval_std[s],
                          meta={"setting": meta["setting"], "mode": meta["mode"], "run": None, "train_seed": seed,
                                "lambda": meta["lambda"], "rewards": list(self.rewards),
                                "weights_key": meta["weights_key"], "checkpoints": [],
                                "sampling": {"n": meta["n"], "seed": meta["eval_seed"], "seed_rule": "seed + k"},
                                "arm": meta["arm"], "cell": True})

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        seed, step, phase, quantity, value, std = [], [], [], [], [], []
        for s, sd in enumerate(self.seeds):
            for k, (st, sampler) in enumerate(self.points):
                for j, name in enumerate(self.scorers):
                    seed.append(sd), step.append(st), phase.append(sampler), quantity.append(name)
                    value.append(float(self.evals[s, k, j])), std.append(float(self.eval_std[s, k, j]))
            for i, st in enumerate(self.steps):
                for name, values in self.train.items():
                    seed.append(sd), step.append(st), phase.append("train"), quantity.append(name)
                    value.append(float(values[s, i])), std.append(None)
        columns = {"seed": pa.array(seed, pa.int64()), "step": pa.array(step, pa.int64()),
                   "phase": pa.array(phase, pa.string()), "quantity": pa.array(quantity, pa.string()),
                   "value": pa.array(value, pa.float64()), "std": pa.array(std, pa.float64())}
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(CELL_COLUMNS.items())))
        return table.replace_schema_metadata({k: json_dumps(v) for k, v in metadata.items()})


def validate_cell(table: CellTable, where: str = "cell table") -> None:
    """BadInput unless ``table`` is a complete, consistent ``recast.cell/1`` table."""
    S, K, m = len(table.seeds), len(table.points), len(table.rewards)
    if S == 0 or K == 0 or m == 0 or not table.steps:
        raise BadInput(f"{where}: no seeds, evaluated points, rewards or training steps")
    if len(set(table.seeds)) != S or len(set(table.points)) != K or len(set(table.rewards)) != m:
        raise BadInput(f"{where}: a seed, a point or a reward is listed twice")
    if any(sampler not in CURVE_SAMPLERS or step < 1 for step, sampler in table.points):
        raise BadInput(f"{where}: evaluated points need a step >= 1 and a sampler of {', '.join(CURVE_SAMPLERS)}")
    for name, values in (("evals", table.evals), ("eval_std", table.eval_std)):
        if np.shape(values) != (S, K, m + 1):
            raise BadInput(f"{where}: {name} has shape {np.shape(values)}, expected {(S, K, m + 1)}")
        check_finite(name, np.asarray(values, dtype=np.float64), where)
    wanted = {*TRAIN_QUANTITIES, *(f"reward/{r}" for r in table.rewards)}
    spreads = {f"reward_spread/{r}" for r in table.rewards}  # cell format 3 on; an older cell has none
    if set(table.train) not in (wanted, wanted | spreads):
        raise BadInput(f"{where}: training quantities {sorted(table.train)}, expected {sorted(wanted)}")
    for name, values in table.train.items():
        if np.shape(values) != (S, len(table.steps)):
            raise BadInput(f"{where}: training quantity {name!r} has shape {np.shape(values)}")
        check_finite(name, np.asarray(values, dtype=np.float64), where)
    require_keys(table.meta, CELL_KEYS, where)
    if list(table.meta["rewards"]) != list(table.rewards) or len(table.meta["lambda"]) != m:
        raise BadInput(f"{where}: metadata rewards/lambda do not match the table's rewards")


def write_cell(path: str | os.PathLike[str], table: CellTable, *, config: Mapping[str, Any] | None = None,
               sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.cell/1`` Parquet file."""
    validate_cell(table)
    provenance = Provenance.new(CELL_SCHEMA, config, sources)
    write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_cell(path: str | os.PathLike[str]) -> CellTable:
    """Read and validate a ``recast.cell/1`` file."""
    arrow, meta, where = open_parquet(path, CELL_SCHEMA)
    require_keys(meta, (*CELL_KEYS, *PROVENANCE_KEYS[1:]), where)
    require_columns(arrow, CELL_COLUMNS, where, not_null=("seed", "step", "phase", "quantity", "value"))
    data = {name: arrow.column(name).to_numpy(zero_copy_only=False) for name in CELL_COLUMNS}
    seeds = tuple(int(s) for s in dict.fromkeys(data["seed"].tolist()))
    rewards = tuple(meta["rewards"])
    scorers = (*rewards, "aggregate")
    is_eval = data["phase"] != "train"
    points = tuple(dict.fromkeys(zip(data["step"][is_eval].tolist(), data["phase"][is_eval].tolist())))
    steps = tuple(sorted(set(data["step"][~is_eval].tolist())))
    seed_at = {s: i for i, s in enumerate(seeds)}
    point_at = {p: i for i, p in enumerate(points)}
    scorer_at = {s: i for i, s in enumerate(scorers)}
    step_at = {s: i for i, s in enumerate(steps)}
    evals = np.full((len(seeds), len(points), len(scorers)), math.nan)
    eval_std = np.full_like(evals, math.nan)
    train: dict[str, np.ndarray] = {}
    for sd, st, ph, q, v, sv in zip(*(data[c].tolist() for c in CELL_COLUMNS)):
        if ph == "train":
            train.setdefault(q, np.full((len(seeds), len(steps)), math.nan))[seed_at[sd], step_at[st]] = v
        elif q not in scorer_at:
            raise BadInput(f"{where}: an evaluation row for {q!r}, which is not a reward of the cell")
        else:
            evals[seed_at[sd], point_at[(st, ph)], scorer_at[q]] = v
            eval_std[seed_at[sd], point_at[(st, ph)], scorer_at[q]] = math.nan if sv is None else sv
    table = CellTable(seeds, rewards, points, evals, eval_std, steps, train,
                      meta={k: v for k, v in meta.items() if k not in PROVENANCE_KEYS},
                      provenance=Provenance.from_metadata(meta, where))
    validate_cell(table, where)  # a missing row leaves a NaN, refused here
    return table

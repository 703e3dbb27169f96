"""``recast.gains/2``: cumulative discriminability and per-step gains, one Parquet row per (reward, t).

t = 0..T for every reward; key-value metadata with JSON values: the run (alpha, beta, T, N, K, P,
sampling, crn, monotone, reward_std, policy, positives) and the provenance (docs/artifacts.md).
Version 2 adds the bootstrap's per-draw gains (column ``gain_draws``, a list of B values per row,
null at t = 0 and where the run made no bootstrap) and, in the metadata, each pair of rewards'
per-step advantage correlation (``advantage_corr``, E14). A ``recast.gains/1`` table is read as a
version 2 table without either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source
from recast_cli.artifacts.jsonio import json_dumps
from recast_cli.artifacts.metadata import check_gain_meta
from recast_cli.artifacts.tables import check_finite, open_parquet, require_columns, require_keys, write_parquet
from recast_cli.errors import BadInput

GAINS_SCHEMA = "recast.gains/2"
#: the earlier version of the schema, read as a table without bootstrap draws or advantage correlations
GAINS_SCHEMA_V1 = "recast.gains/1"

SAMPLINGS = ("pplus", "pold", "exact")
MONOTONE_METHODS = ("clip", "isotonic", "none")

GAIN_COLUMNS: dict[str, pa.DataType] = {
    "reward": pa.string(),
    "t": pa.int32(),
    "sigma": pa.float64(),
    "D": pa.float64(),
    "D_lo": pa.float64(),
    "D_hi": pa.float64(),
    "gain_raw": pa.float64(),
    "gain": pa.float64(),
    "gain_lo": pa.float64(),
    "gain_hi": pa.float64(),
    "gain_draws": pa.list_(pa.float64()),
}
#: the columns a ``recast.gains/1`` table has (all of version 2's but ``gain_draws``)
GAIN_COLUMNS_V1 = {k: v for k, v in GAIN_COLUMNS.items() if k != "gain_draws"}

#: Run metadata a gain table must carry besides its provenance (ARCHITECTURE.md).
GAIN_RUN_KEYS = (
    "alpha", "beta", "N", "K", "P", "sampling", "crn", "monotone", "reward_std", "policy", "positives",
)


@dataclass(frozen=True)
class GainTable:
    """Cumulative discriminability and per-step gains of m rewards on a grid of T steps (E4, E5).

    Arrays are indexed by reward first. ``D[:, t]`` is D_{i,t} for t = 0..T; gains are
    per step: ``gain[:, t-1]`` is ΔD_{i,t} for t = 1..T. Interval arrays are None when the
    run made no bootstrap. ``gain_draws`` [B, m, T] holds the gains of each of the bootstrap's B
    resamples (None: not recorded), from which ``solve-w`` solves one W per draw. ``meta`` holds the
    run metadata (alpha, beta, N, K, P, sampling, crn, monotone, reward_std, policy, positives, and
    optionally grid / surrogate checks / ``advantage_corr``, E14).
    """

    rewards: tuple[str, ...]
    sigmas: np.ndarray
    D: np.ndarray
    gain_raw: np.ndarray
    gain: np.ndarray
    D_lo: np.ndarray | None = None
    D_hi: np.ndarray | None = None
    gain_lo: np.ndarray | None = None
    gain_hi: np.ndarray | None = None
    gain_draws: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def T(self) -> int:
        return len(self.sigmas) - 1

    @property
    def m(self) -> int:
        return len(self.rewards)

    def total_gain(self) -> np.ndarray:
        """Σ_t ΔD_{i,t} per reward: D_{i,0} when the gains telescope (E5)."""
        return self.gain.sum(axis=1)

    def peak_step(self) -> np.ndarray:
        """The step t (1..T) with the largest gain, per reward."""
        return self.gain.argmax(axis=1) + 1

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        m, T = self.m, self.T
        t = np.tile(np.arange(T + 1, dtype=np.int32), m)

        def with_null_t0(per_step: np.ndarray | None) -> pa.Array:
            if per_step is None:
                return pa.nulls(m * (T + 1), type=pa.float64())
            full = np.concatenate([np.full((m, 1), np.nan), per_step], axis=1).ravel()
            return pa.array(full, type=pa.float64(), mask=np.isnan(full))

        def per_level(values: np.ndarray | None) -> pa.Array:
            if values is None:
                return pa.nulls(m * (T + 1), type=pa.float64())
            return pa.array(np.asarray(values, dtype=np.float64).ravel(), type=pa.float64())

        columns = {
            "reward": pa.array(np.repeat(np.array(self.rewards, dtype=object), T + 1), type=pa.string()),
            "t": pa.array(t, type=pa.int32()),
            "sigma": pa.array(np.tile(self.sigmas, m), type=pa.float64()),
            "D": per_level(self.D),
            "D_lo": per_level(self.D_lo),
            "D_hi": per_level(self.D_hi),
            "gain_raw": with_null_t0(self.gain_raw),
            "gain": with_null_t0(self.gain),
            "gain_lo": with_null_t0(self.gain_lo),
            "gain_hi": with_null_t0(self.gain_hi),
            "gain_draws": self._draws_column(),
        }
        metadata = {**self.meta, "T": T, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(GAIN_COLUMNS.items())))
        return table.replace_schema_metadata({k: json_dumps(v) for k, v in metadata.items()})


    def _draws_column(self) -> pa.Array:
        """``gain_draws`` as a list column: row (i, t) holds the B draws of ΔD_{i,t}; null at t = 0."""
        m, T = self.m, self.T
        if self.gain_draws is None:
            return pa.nulls(m * (T + 1), type=pa.list_(pa.float64()))
        B = self.gain_draws.shape[0]
        values = np.zeros((m, T + 1, B))
        values[:, 1:] = np.transpose(np.asarray(self.gain_draws, dtype=np.float64), (1, 2, 0))
        offsets = pa.array(np.arange(m * (T + 1) + 1, dtype=np.int32) * B)
        mask = np.zeros((m, T + 1), dtype=bool)
        mask[:, 0] = True
        return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), type=pa.float64()),
                                        mask=pa.array(mask.ravel()))


def validate_gain_table(table: GainTable, where: str = "gain table") -> None:
    """Raise BadInput unless the arrays and metadata form a valid ``recast.gains/1`` table."""
    m, T = table.m, table.T
    if m == 0:
        raise BadInput(f"{where}: no rewards")
    if len(set(table.rewards)) != m:
        raise BadInput(f"{where}: duplicate reward names {list(table.rewards)}")
    if T < 1:
        raise BadInput(f"{where}: needs at least t = 0 and t = 1 (T >= 1)")
    sig = np.asarray(table.sigmas, dtype=np.float64)
    check_finite("sigma", sig, where)
    if sig[0] != 0.0:
        raise BadInput(f"{where}: sigma at t = 0 must be 0 (clean data), got {sig[0]!r}")
    if not np.all(np.diff(sig) > 0):
        t_bad = int(np.argmax(np.diff(sig) <= 0)) + 1
        raise BadInput(f"{where}: sigma must increase strictly with t (t = T the noisiest); not at t = {t_bad}")
    if sig[-1] > 1.0:
        raise BadInput(f"{where}: sigma must lie in [0, 1], got {sig[-1]!r} at t = {T}")
    shapes = {"D": (m, T + 1), "D_lo": (m, T + 1), "D_hi": (m, T + 1),
              "gain_raw": (m, T), "gain": (m, T), "gain_lo": (m, T), "gain_hi": (m, T)}
    for name, shape in shapes.items():
        values = getattr(table, name)
        if values is None:
            if name in ("D", "gain", "gain_raw"):
                raise BadInput(f"{where}: column {name!r} is missing")
            continue
        if np.shape(values) != shape:
            raise BadInput(f"{where}: column {name!r} has shape {np.shape(values)}, expected {shape}")
        check_finite(name, np.asarray(values, dtype=np.float64), where, table.rewards)
    _check_draws(table, where)
    if np.any(table.gain < 0):
        i, j = np.argwhere(table.gain < 0)[0]
        raise BadInput(f"{where}: 'gain' must be non-negative; reward {table.rewards[i]!r} has "
                       f"{table.gain[i, j]:.3g} at t = {j + 1}")
    require_keys(table.meta, GAIN_RUN_KEYS, where)
    if table.meta["sampling"] not in SAMPLINGS:
        raise BadInput(f"{where}: metadata 'sampling' must be one of {SAMPLINGS}, got {table.meta['sampling']!r}")
    if table.meta["monotone"] not in MONOTONE_METHODS:
        raise BadInput(f"{where}: metadata 'monotone' must be one of {MONOTONE_METHODS}, "
                       f"got {table.meta['monotone']!r}")
    if "grid" in table.meta:
        from recast_cli.grid import GridSpec

        GridSpec.from_json(table.meta["grid"], where)
    check_gain_meta(table.meta, table.rewards, T, where)  # the rest, advantage_corr (E14) with it


#: the most bootstrap draws a table may record per (reward, step)
MAX_DRAWS = 10_000


def _check_draws(table: GainTable, where: str) -> None:
    """The draws' shape [B, m, T] with 2 <= B <= MAX_DRAWS, finite and non-negative like the gains."""
    draws = table.gain_draws
    if draws is None:
        return
    shape = np.shape(draws)
    if len(shape) != 3 or shape[1:] != (table.m, table.T) or not 2 <= shape[0] <= MAX_DRAWS:
        raise BadInput(f"{where}: column 'gain_draws' must hold 2 … {MAX_DRAWS} draws for every (reward, t >= 1); "
                       f"got shape {list(shape)} for {table.m} rewards and T = {table.T}")
    values = np.asarray(draws, dtype=np.float64)
    if not np.isfinite(values).all() or np.any(values < 0):
        raise BadInput(f"{where}: column 'gain_draws' must hold finite non-negative gains")


def write_gains(path: str | os.PathLike[str], table: GainTable, *, config: Mapping[str, Any] | None = None,
                sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.gains/2`` Parquet file."""
    validate_gain_table(table)
    provenance = Provenance.new(GAINS_SCHEMA, config, sources)
    write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_gains(path: str | os.PathLike[str]) -> GainTable:
    """Read and validate a ``recast.gains/2`` (or ``/1``) Parquet file (BadInput names what is wrong)."""
    arrow, meta, where = open_parquet(path, GAINS_SCHEMA)
    version1 = meta.get("schema") == GAINS_SCHEMA_V1
    _check_gain_columns(arrow, where, GAIN_COLUMNS_V1 if version1 else GAIN_COLUMNS)
    cells = _GainCells.of(arrow, where)
    if "T" in meta and meta["T"] != cells.T:
        raise BadInput(f"{where}: metadata T = {meta['T']} but rows run t = 0..{cells.T}")
    require_keys(meta, ("T", *PROVENANCE_KEYS[1:]), where)
    sigma = cells.sigma()
    table = GainTable(
        rewards=cells.rewards,
        sigmas=sigma[0],
        D=cells.grid("D"),
        gain_raw=cells.per_step("gain_raw", optional=False),
        gain=cells.per_step("gain", optional=False),
        D_lo=cells.per_level("D_lo"),
        D_hi=cells.per_level("D_hi"),
        gain_lo=cells.per_step("gain_lo", optional=True),
        gain_hi=cells.per_step("gain_hi", optional=True),
        gain_draws=None if version1 else cells.draws(),
        meta={k: v for k, v in meta.items() if k not in (*PROVENANCE_KEYS, "T")},
        provenance=Provenance.from_metadata(meta, where),
    )
    validate_gain_table(table, where)
    return table


def _check_gain_columns(arrow: pa.Table, where: str, columns: dict[str, pa.DataType]) -> None:
    """Every gain column present with its type (or all null), the key columns never null, and at least
    one row: what the grids below read, checked before any of them is built."""
    require_columns(arrow, columns, where)

    def float_list(dtype: pa.DataType) -> bool:
        return pa.types.is_list(dtype) and pa.types.is_floating(dtype.value_type)

    kinds = {"reward": pa.types.is_string, "t": pa.types.is_integer, "gain_draws": float_list}
    for name in columns:
        check = kinds.get(name, pa.types.is_floating)
        dtype = arrow.schema.field(name).type
        if not (check(dtype) or pa.types.is_null(dtype) or (name == "reward" and pa.types.is_large_string(dtype))):
            raise BadInput(f"{where}: column {name!r} has type {dtype}, expected {columns[name]}")
    require_columns(arrow, columns, where, not_null=("reward", "t", "sigma", "D"))
    if arrow.num_rows == 0:
        raise BadInput(f"{where}: the table holds no row (no reward, no step); a gain table has one row per "
                       "(reward, t = 0..T)")


@dataclass(frozen=True)
class _GainCells:
    """The rows of a gain table placed on the (reward, t) grid: row k is cell (rows[k], t_col[k]).

    Built once the rows are known to hold every (reward, t = 0..T) exactly once; each column is then
    read as an [m, T + 1] array, its nulls checked against where the column may have them.
    """

    arrow: pa.Table
    where: str
    rewards: tuple[str, ...]
    rows: np.ndarray
    t_col: np.ndarray
    T: int

    @classmethod
    def of(cls, arrow: pa.Table, where: str) -> _GainCells:
        """The cells of ``arrow``'s rows; BadInput on a duplicate (reward, t) or a reward whose t has gaps."""
        reward_col = arrow.column("reward").to_pylist()
        t_col = arrow.column("t").to_numpy().astype(np.int64)
        rewards = tuple(dict.fromkeys(reward_col))
        index = {r: i for i, r in enumerate(rewards)}
        seen: set[tuple[str, int]] = set()
        for r, t in zip(reward_col, t_col.tolist()):
            if (r, t) in seen:
                raise BadInput(f"{where}: duplicate row for (reward {r!r}, t = {t})")
            seen.add((r, t))
        T = int(t_col.max())
        for r in rewards:
            ts = sorted(t for (rr, t) in seen if rr == r)
            if ts != list(range(T + 1)):
                raise BadInput(f"{where}: t of reward {r!r} is not contiguous 0..{T} (has {_ranges(ts)})")
        return cls(arrow, where, rewards, np.array([index[r] for r in reward_col]), t_col, T)

    def grid(self, name: str) -> np.ndarray:
        """Column ``name`` as [m, T + 1] floats (NaN where null)."""
        out = np.full((len(self.rewards), self.T + 1), np.nan)
        out[self.rows, self.t_col] = self.arrow.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        return out

    def null(self, name: str) -> np.ndarray:
        """Where column ``name`` is null, as [m, T + 1] booleans."""
        mask = np.zeros((len(self.rewards), self.T + 1), dtype=bool)
        mask[self.rows, self.t_col] = self.arrow.column(name).is_null().to_numpy(zero_copy_only=False)
        return mask

    def sigma(self) -> np.ndarray:
        """The σ grid, [m, T + 1]; BadInput unless every reward has the same one."""
        sigma = self.grid("sigma")
        if not np.all(sigma == sigma[:1]):
            i, t = np.argwhere(sigma != sigma[:1])[0]
            raise BadInput(f"{self.where}: sigma differs between rewards at t = {t} (reward {self.rewards[i]!r})")
        return sigma

    def per_step(self, name: str, *, optional: bool) -> np.ndarray | None:
        """A per-step column, [m, T] for t = 1..T: null at t = 0 and nowhere else (None when ``optional``
        and null throughout)."""
        values = self.grid(name)
        if not np.isnan(values[:, 0]).all():
            raise BadInput(f"{self.where}: column {name!r} must be null at t = 0")
        body = values[:, 1:]
        null = self.null(name)[:, 1:]
        if optional and null.all():
            return None
        self._refuse_nulls(name, null, first_t=1)
        return body

    def per_level(self, name: str) -> np.ndarray | None:
        """An optional per-level column, [m, T + 1]: null nowhere, or everywhere (None)."""
        null = self.null(name)
        if null.all():
            return None
        self._refuse_nulls(name, null, first_t=0)
        return self.grid(name)

    def draws(self) -> np.ndarray | None:
        """``gain_draws`` as [B, m, T] (None: null at every t >= 1); BadInput unless every row t >= 1 holds
        the same number B of draws and every row t = 0 is null."""
        column = self.arrow.column("gain_draws")
        if pa.types.is_null(column.type):
            return None
        null = self.null("gain_draws")
        if not null[:, 0].all():
            raise BadInput(f"{self.where}: column 'gain_draws' must be null at t = 0")
        if null[:, 1:].all():
            return None
        self._refuse_nulls("gain_draws", null[:, 1:], first_t=1)
        lists = column.combine_chunks()
        lengths = lists.value_lengths().to_numpy(zero_copy_only=False)
        body = ~column.is_null().to_numpy(zero_copy_only=False)
        sizes = set(lengths[body].astype(np.int64).tolist())
        if len(sizes) != 1 or not 2 <= next(iter(sizes)) <= MAX_DRAWS:
            raise BadInput(f"{self.where}: column 'gain_draws' must hold the same number of draws (2 … "
                           f"{MAX_DRAWS}) in every row t >= 1, got {sorted(sizes)[:5]}")
        B = sizes.pop()
        flat = lists.values.to_numpy(zero_copy_only=False).astype(np.float64)  # offsets index the raw values
        starts = lists.offsets.to_numpy()[:-1][body].astype(np.int64)
        out = np.full((len(self.rewards), self.T + 1, B), np.nan)
        rows, ts = self.rows[body], self.t_col[body]
        out[rows, ts] = flat[starts[:, None] + np.arange(B)[None, :]]
        return np.transpose(out[:, 1:], (2, 0, 1)).copy()

    def _refuse_nulls(self, name: str, null: np.ndarray, *, first_t: int) -> None:
        """BadInput naming the first null cell of ``null`` (whose column 0 is t = ``first_t``), if any."""
        if null.any():
            i, j = np.argwhere(null)[0]
            raise BadInput(f"{self.where}: column {name!r} is null at (reward {self.rewards[i]!r}, "
                           f"t = {j + first_t})")


def _ranges(ts: Sequence[int]) -> str:
    if not ts:
        return "none"
    parts, start, prev = [], ts[0], ts[0]
    for t in list(ts[1:]) + [None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        parts.append(f"{start}" if start == prev else f"{start}..{prev}")
        if t is not None:
            start = prev = t
    return ", ".join(parts)

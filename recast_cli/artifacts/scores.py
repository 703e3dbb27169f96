"""``recast.scores/1``: the raw score of every rollout endpoint, one Parquet row per (prompt, sample, t, k, reward).

Every gain table of the run can be recomputed from it (other α, β, projection) with no rollout.
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
from recast_cli.artifacts.tables import open_parquet, require_columns, require_keys, write_parquet
from recast_cli.errors import BadInput


SCORES_SCHEMA = "recast.scores/1"

SCORE_COLUMNS: dict[str, pa.DataType] = {
    "prompt_id": pa.int32(),
    "prompt": pa.string(),
    "sample": pa.int32(),
    "t": pa.int32(),
    "k": pa.int32(),
    "reward": pa.string(),
    "score": pa.float64(),
}

#: Run metadata a scores table must carry besides its provenance.
SCORE_RUN_KEYS = ("run_id", "rewards", "T", "N", "K", "P", "sigmas", "sampling", "crn", "rollout_noise",
                  "guidance_scale", "policy", "positives", "seed")


@dataclass(frozen=True)
class ScoreTable:
    """Raw reward scores of every rollout endpoint of one estimation run (or shard).

    ``scores[p, n, t, k, i]`` is reward i of rollout k from x_t of sample n of prompt p;
    t = 0 holds the sample itself (k = 0 only; the other k are NaN): the positive under
    π⁺-sampling, the trajectory's own endpoint under π^old-sampling. ``prompt_ids`` and
    ``prompts`` name the P prompts in table order.
    """

    prompt_ids: tuple[int, ...]
    prompts: tuple[str, ...]
    rewards: tuple[str, ...]
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return self.scores.shape  # type: ignore[return-value]

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        P, N, T1, K, m = self.scores.shape
        p, n, t, k, i = (a.ravel() for a in np.meshgrid(np.arange(P), np.arange(N), np.arange(T1), np.arange(K),
                                                          np.arange(m), indexing="ij"))
        keep = (t > 0) | (k == 0)
        p, n, t, k, i = p[keep], n[keep], t[keep], k[keep], i[keep]
        columns = {
            "prompt_id": pa.array(np.asarray(self.prompt_ids, dtype=np.int32)[p], type=pa.int32()),
            "prompt": pa.array(np.asarray(self.prompts, dtype=object)[p], type=pa.string()),
            "sample": pa.array(n.astype(np.int32), type=pa.int32()),
            "t": pa.array(t.astype(np.int32), type=pa.int32()),
            "k": pa.array(k.astype(np.int32), type=pa.int32()),
            "reward": pa.array(np.asarray(self.rewards, dtype=object)[i], type=pa.string()),
            "score": pa.array(self.scores[p, n, t, k, i], type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(SCORE_COLUMNS.items())))
        return table.replace_schema_metadata({key: json_dumps(v) for key, v in metadata.items()})


def write_scores(path: str | os.PathLike[str], table: ScoreTable, *, config: Mapping[str, Any] | None = None,
                 sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Write a ``recast.scores/1`` Parquet file atomically."""
    require_keys(table.meta, SCORE_RUN_KEYS, "scores table")
    body = table.scores[:, :, 1:]
    if not np.isfinite(body).all() or not np.isfinite(table.scores[:, :, 0, 0]).all():
        raise BadInput("scores table: every rollout score must be finite")
    provenance = Provenance.new(SCORES_SCHEMA, config, sources)
    write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_scores(path: str | os.PathLike[str]) -> ScoreTable:
    """Read and validate a ``recast.scores/1`` file back into its dense [P, N, T+1, K, m] array."""
    arrow, meta, where = open_parquet(path, SCORES_SCHEMA)
    require_keys(meta, (*SCORE_RUN_KEYS, *PROVENANCE_KEYS[1:]), where)
    require_columns(arrow, SCORE_COLUMNS, where, not_null=tuple(SCORE_COLUMNS))
    rewards = tuple(meta["rewards"])
    T, N, K = int(meta["T"]), int(meta["N"]), int(meta["K"])
    pid = arrow.column("prompt_id").to_numpy().astype(np.int64)
    prompt_col = arrow.column("prompt").to_pylist()
    order: dict[int, str] = {}
    for i, text in zip(pid.tolist(), prompt_col):
        if order.setdefault(i, text) != text:
            raise BadInput(f"{where}: prompt_id {i} names two different prompts")
    prompt_ids = tuple(sorted(order))
    index = {i: j for j, i in enumerate(prompt_ids)}
    reward_index = {r: j for j, r in enumerate(rewards)}
    unknown = set(arrow.column("reward").to_pylist()) - set(rewards)
    if unknown:
        raise BadInput(f"{where}: rows name rewards {sorted(unknown)} that the metadata does not list")
    n = arrow.column("sample").to_numpy().astype(np.int64)
    t = arrow.column("t").to_numpy().astype(np.int64)
    k = arrow.column("k").to_numpy().astype(np.int64)
    if n.min(initial=0) < 0 or n.max(initial=0) >= N or t.min(initial=0) < 0 or t.max(initial=0) > T \
            or k.min(initial=0) < 0 or k.max(initial=0) >= K or np.any((t == 0) & (k != 0)):
        raise BadInput(f"{where}: sample, t or k outside the run's N = {N}, T = {T}, K = {K}")
    r = np.array([reward_index[x] for x in arrow.column("reward").to_pylist()], dtype=np.int64)
    dense = np.full((len(prompt_ids), N, T + 1, K, len(rewards)), np.nan)
    filled = np.zeros(dense.shape, dtype=np.int32)
    rows = np.array([index[i] for i in pid.tolist()], dtype=np.int64)
    dense[rows, n, t, k, r] = arrow.column("score").to_numpy()
    np.add.at(filled, (rows, n, t, k, r), 1)
    expected = np.zeros(dense.shape, dtype=np.int32)
    expected[:, :, 1:] = 1
    expected[:, :, 0, 0] = 1
    if np.any(filled > 1):
        raise BadInput(f"{where}: duplicate (prompt, sample, t, k, reward) rows")
    if np.any(filled != expected):
        raise BadInput(f"{where}: incomplete: some (prompt, sample, t, k, reward) rows are missing")
    if not np.isfinite(dense[expected == 1]).all():
        raise BadInput(f"{where}: column 'score' has NaN or inf")
    return ScoreTable(prompt_ids=prompt_ids, prompts=tuple(order[i] for i in prompt_ids), rewards=rewards,
                      scores=dense, meta={key: v for key, v in meta.items() if key not in PROVENANCE_KEYS},
                      provenance=Provenance.from_metadata(meta, where))

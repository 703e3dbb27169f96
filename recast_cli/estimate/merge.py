"""``recast merge``: the scores tables of a sharded ``recast estimate`` run → one table, checked whole.

Each shard's table records its place (``shard = [i, n]``) and the run's prompt count ``P``, so
merging knows what a whole run holds: a merge that lacks prompts (a shard not given, or not yet
finished) is refused, naming what is missing, unless ``--allow-partial``, which warns and records
the gap as ``partial`` in the merged table's metadata (and from there in every gain table).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts import ScoreTable, read_scores
from recast_cli.errors import BadInput


def merge_scores(paths: Sequence[str | Path], allow_partial: bool = False) -> ScoreTable:
    """Shards of one run → one scores table (prompts in id order), exactly as a single run would hold them.

    BadInput when the shards come from different runs or share a prompt, and when prompts of the run
    are missing, unless ``allow_partial`` (then ``meta["partial"]`` says what is missing).
    """
    tables = [read_scores(p) for p in paths]
    run_ids = {t.meta["run_id"] for t in tables}
    if len(run_ids) != 1:
        raise BadInput(f"the shards come from different runs (run ids {', '.join(sorted(run_ids))})")
    seen: set[int] = set()
    for path, t in zip(paths, tables):
        overlap = seen & set(t.prompt_ids)
        if overlap:
            raise BadInput(f"{path}: prompt_id {min(overlap)} is in another shard too")
        seen |= set(t.prompt_ids)
    order = sorted((pid, ti, j) for ti, t in enumerate(tables) for j, pid in enumerate(t.prompt_ids))
    first = tables[0]
    dense = np.stack([tables[ti].scores[j] for _, ti, j in order])
    meta = {**first.meta, "shard": [0, 1]}
    meta.pop("partial", None)  # a partial merge merged again: judged afresh below
    gap = missing(tables, len(order))
    if gap is not None:
        if not allow_partial:
            raise BadInput(f"the shards hold {gap['prompts']} of the run's {gap['of']} prompts: {describe(gap)}; "
                           "give every shard, or pass --allow-partial to build the tables from these prompts only")
        meta["partial"] = gap
    return ScoreTable(prompt_ids=tuple(pid for pid, _, _ in order),
                      prompts=tuple(tables[ti].prompts[j] for _, ti, j in order),
                      rewards=first.rewards, scores=dense, meta=meta)


def missing(tables: Sequence[ScoreTable], merged: int) -> dict[str, Any] | None:
    """What the shards lack of their run (None: nothing): the prompt counts, and which shards ``i/n``
    were not given when every shard split the run the same way (the same n)."""
    total = max(int(t.meta["P"]) for t in tables)
    if merged >= total:
        return None
    gap: dict[str, Any] = {"prompts": merged, "of": total, "missing_prompts": total - merged}
    splits = {tuple(t.meta.get("shard") or (0, 1)) for t in tables}
    counts = {n for _, n in splits}
    if len(counts) == 1:
        n = counts.pop()
        gap["missing_shards"] = [f"{i}/{n}" for i in range(n) if (i, n) not in splits]
    return gap


def describe(gap: dict[str, Any]) -> str:
    """One phrase naming the gap: the missing shards where known, else the count of missing prompts."""
    shards = gap.get("missing_shards")
    count = f"{gap['missing_prompts']} prompt{'s' if gap['missing_prompts'] != 1 else ''}"
    if shards:
        return f"shard{'s' if len(shards) > 1 else ''} {', '.join(shards)} missing ({count})"
    return f"{count} missing"

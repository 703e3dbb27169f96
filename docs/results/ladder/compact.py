"""From the ladder study's cells to the compact files the analysis reads (committed in ``data/``).

    python docs/results/ladder/compact.py [STUDY_ROOT [DEST]]   # default: artifacts/ladder, this folder

Per world (``STUDY_ROOT/<world>/``, the ``--out`` of ``recast study``):

* ``data/<world>-points.parquet``: every seed's value of every reward and the aggregate at every
  evaluated point — columns arm, rate, seed, step, sampler (sde | ode), scorer, value (float64);
* ``data/<world>-train.parquet``: every seed's training batch mean of every reward per step and its
  within-group spread (the stall detector's inputs) — arm, rate, seed, step, reward, value, spread;
* ``data/<world>-cells.json``: per cell, its metadata (the base policy's evaluation, each reward's
  range, W, the first gradient and each reward's gradient signal and noise, λ, the recipe) and
  its clip fractions;
* ``data/<world>/gains/*.parquet`` and ``data/<world>/W/*.safetensors``: the gain tables and every W;
* ``<world>/report.md`` and ``<world>/endpoints.csv``: ``recast study``'s own report.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts import read_cell

HERE = Path(__file__).resolve().parent
WORLDS = ("independent", "conflict-mild", "conflict-strong", "control")
DROP = ("setting", "weights", "made_from", "engine")  # paths and machine facts: not what the analysis reads


def compact(root: Path, world: str, dest: Path = HERE) -> None:
    study = root / world
    data = dest / "data"
    data.mkdir(exist_ok=True)
    points: dict[str, list] = {k: [] for k in ("arm", "rate", "seed", "step", "sampler", "scorer", "value")}
    train: dict[str, list] = {k: [] for k in ("arm", "rate", "seed", "step", "reward", "value", "spread")}
    cells = {}
    for path in sorted((study / "cells").glob("*.parquet")):
        cell = read_cell(path)
        arm, rate = cell.label, float(cell.meta["learning_rate"])
        for s, seed in enumerate(cell.seeds):
            for k, (step, sampler) in enumerate(cell.points):
                for j, scorer in enumerate(cell.scorers):
                    for key, v in zip(points, (arm, rate, seed, step, sampler, scorer, float(cell.evals[s, k, j]))):
                        points[key].append(v)
            for reward in cell.rewards:
                values, spreads = cell.train[f"reward/{reward}"][s], cell.train[f"reward_spread/{reward}"][s]
                for i, step in enumerate(cell.steps):
                    for key, v in zip(train, (arm, rate, seed, step, reward, float(values[i]), float(spreads[i]))):
                        train[key].append(v)
        meta = {k: v for k, v in cell.meta.items() if k not in DROP}
        meta["clip_frac"] = {"mean": float(cell.train["clip_frac"].mean()), "max": float(cell.train["clip_frac"].max())}
        meta["seeds"] = [int(s) for s in cell.seeds]
        cells[path.stem] = meta
    for name, table in ((f"{world}-points.parquet", points), (f"{world}-train.parquet", train)):
        pq.write_table(pa.table(table), data / name, compression="zstd")
    (data / f"{world}-cells.json").write_text(json.dumps(cells, indent=1, sort_keys=True))
    for sub in ("gains", "W"):
        target = data / world / sub
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted((study / sub).glob("*")):
            if f.suffix in (".parquet", ".safetensors"):
                shutil.copyfile(f, target / f.name)
    report = dest / world
    report.mkdir(exist_ok=True)
    for name in ("report.md", "endpoints.csv"):
        shutil.copyfile(study / "report" / name, report / name)
    print(f"{world}: {len(cells)} cells, {len(points['value'])} points, {len(train['value'])} training means")
    assert np.isfinite(points["value"]).all()


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "artifacts" / "ladder"
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE
    for world in WORLDS:
        if (root / world / "cells").is_dir():
            compact(root, world, dest)

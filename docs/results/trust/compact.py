"""From the trust study's cells to the compact files the analysis reads (committed in ``data/``).

    python docs/results/trust/compact.py [STUDY_ROOT [DEST]]   # default: artifacts/trust, this folder

The ladder study's compaction (``docs/results/ladder/compact.py``), run on this study's worlds: per world,
``data/<world>-points.parquet`` (every seed's value of every reward and the aggregate at every evaluated
point), ``data/<world>-train.parquet`` (training means and spreads), ``data/<world>-cells.json`` (each cell's
metadata and W), ``data/<world>/gains/`` (the estimate, its π^old companion ``conflicts``, the exact table,
with their scores) and ``data/<world>/W/``, and ``<world>/report.md`` / ``<world>/endpoints.csv``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLDS = ("independent", "conflict-mild", "conflict-strong", "control", "tug")


def ladder_compact():
    spec = importlib.util.spec_from_file_location("ladder_compact", HERE.parent / "ladder" / "compact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compact


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "artifacts" / "trust"
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE
    compact = ladder_compact()
    for world in WORLDS:
        if (root / world / "report" / "report.md").is_file():  # a world whose study has finished (its report)
            compact(root, world, dest)

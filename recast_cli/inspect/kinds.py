"""The artifact kinds ``recast inspect`` knows, one row each: schema tag → reader → summariser → renderer.

``inspect`` reads an artifact by the tag it declares (``artifacts.artifact_schema``), turns it into
a JSON-ready summary (what ``--json`` prints), and renders that summary as rich tables: the three
steps of every kind are the three columns of :data:`KINDS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from recast_cli.artifacts import (
    CELL_SCHEMA,
    CHECKPOINT_SCHEMA,
    CURVE_SCHEMA,
    EVAL_SCHEMA,
    GAINS_SCHEMA,
    IMAGE_SCORES_SCHEMA,
    JUDGEMENTS_SCHEMA,
    POSITIVES_SCHEMA,
    READERS,
    RUN_SCHEMA,
    SCORES_SCHEMA,
    WEIGHTS_SCHEMA,
    artifact_schema,
)
from recast_cli.artifacts.metrics import METRICS_SCHEMA
from recast_cli.errors import BadInput
from recast_cli.inspect.load import load_checkpoint, load_image_scores, load_judgements, load_metrics, load_run
from recast_cli.inspect.render import (
    Renderer,
    render_cell,
    render_checkpoint,
    render_curve,
    render_eval,
    render_gains,
    render_image_scores,
    render_judgements,
    render_metrics,
    render_positives,
    render_run,
    render_scores,
    render_summary,
    render_weights,
)
from recast_cli.inspect.summarise import (
    json_safe,
    summarise_cell,
    summarise_checkpoint,
    summarise_curve,
    summarise_eval,
    summarise_gains,
    summarise_image_scores,
    summarise_judgements,
    summarise_metrics,
    summarise_positives,
    summarise_run,
    summarise_scores,
    summarise_weights,
)


@dataclass(frozen=True)
class Kind:
    """One artifact kind: the schema tag it declares, its ``"kind"`` in the summary, and how it is shown."""

    tag: str
    name: str
    load: Callable[[Path], Any]
    summarise: Callable[[Any], dict[str, Any]]
    render: Renderer


#: Every kind, in the order inspect's error message lists the tags. The schemas of
#: ``recast_cli.artifacts`` are read by its READERS; metrics, image scores and judgements are kept
#: with their metadata, a run folder is shown whole (record, checkpoints, metrics), and a
#: checkpoint is verified with torch (``train.checkpoint``).
KINDS: tuple[Kind, ...] = (
    Kind(GAINS_SCHEMA, "gains", READERS[GAINS_SCHEMA], summarise_gains, render_gains),
    Kind(WEIGHTS_SCHEMA, "weights", READERS[WEIGHTS_SCHEMA], summarise_weights, render_weights),
    Kind(SCORES_SCHEMA, "scores", READERS[SCORES_SCHEMA], summarise_scores, render_scores),
    Kind(POSITIVES_SCHEMA, "positives", READERS[POSITIVES_SCHEMA], summarise_positives, render_positives),
    Kind(EVAL_SCHEMA, "eval", READERS[EVAL_SCHEMA], summarise_eval, render_eval),
    Kind(CURVE_SCHEMA, "curve", READERS[CURVE_SCHEMA], summarise_curve, render_curve),
    Kind(CELL_SCHEMA, "cell", READERS[CELL_SCHEMA], summarise_cell, render_cell),
    Kind(METRICS_SCHEMA, "metrics", load_metrics, summarise_metrics, render_metrics),
    Kind(IMAGE_SCORES_SCHEMA, "image-scores", load_image_scores, summarise_image_scores, render_image_scores),
    Kind(JUDGEMENTS_SCHEMA, "judgements", load_judgements, summarise_judgements, render_judgements),
    Kind(RUN_SCHEMA, "run", load_run, summarise_run, render_run),
    Kind(CHECKPOINT_SCHEMA, "checkpoint", load_checkpoint, summarise_checkpoint, render_checkpoint),
)
BY_TAG = {kind.tag: kind for kind in KINDS}
BY_NAME = {kind.name: kind for kind in KINDS}


def load_artifact(path: str | os.PathLike[str]) -> tuple[Kind, Any]:
    """Any artifact and its kind, by its schema tag (Parquet metadata, safetensors header) or folder marker."""
    tag, p = artifact_schema(path)
    if tag is None:
        raise BadInput(f"{p}: no 'schema' tag in its metadata; not a recast artifact")
    if tag not in BY_TAG:
        raise BadInput(f"{p}: schema tag {tag!r} is not one recast inspect reads ({', '.join(BY_TAG)})")
    kind = BY_TAG[tag]
    return kind, kind.load(p)


def summarise(kind: Kind, artifact: Any) -> dict[str, Any]:
    """A JSON-serialisable description: schema, provenance, run facts and per-reward (per-scorer) rows.

    NaN and infinite numbers come out as None, so ``json.dumps(..., allow_nan=False)`` takes every summary.
    """
    return json_safe(kind.summarise(artifact))


def render(summary: dict[str, Any], path: str, console: Console) -> None:
    """Print a summary as a provenance panel and its kind's table."""
    render_summary(summary, path, console, BY_NAME[summary["kind"]].render)

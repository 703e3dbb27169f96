"""Reading any artifact for ``recast inspect``: by its schema tag, or a run / checkpoint folder whole."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from recast_cli.artifacts import (
    CHECKPOINT_SCHEMA,
    READERS,
    RUN_SCHEMA,
    CurveTable,
    EvalTable,
    IMAGE_SCORES_SCHEMA,
    JUDGEMENTS_SCHEMA,
    GainTable,
    Positives,
    RunRecord,
    ScoreTable,
    WeightMatrix,
    artifact_schema,
    decode_metadata,
    list_checkpoints,
    read_image_scores,
    read_judgements,
    read_run,
)
from recast_cli.errors import BadInput
from recast_cli.artifacts.metrics import METRICS_SCHEMA, read_metrics


@dataclass(frozen=True)
class ParquetArtifact:
    """A Parquet artifact read as a table: training metrics, image scores or judgements."""

    kind: str
    table: pa.Table
    meta: dict[str, Any]
    path: Path


@dataclass(frozen=True)
class CheckpointFolder:
    """``RUN/checkpoints/step-NNNNNN``: its manifest and state as found, and whether it verifies."""

    root: Path
    step: int | None
    manifest: dict[str, Any]
    state: dict[str, Any]
    verified: bool
    problem: str | None


@dataclass(frozen=True)
class RunFolder:
    """A ``recast.run/1`` folder: run.json, its checkpoints (the latest verified), its metrics."""

    root: Path
    record: RunRecord
    steps: tuple[int, ...]
    latest: CheckpointFolder | None
    metrics: ParquetArtifact | None


Artifact = GainTable | WeightMatrix | ScoreTable | Positives | EvalTable | CurveTable | ParquetArtifact | \
    RunFolder | CheckpointFolder


def _parquet_artifact(kind: str, table: pa.Table, path: Path) -> ParquetArtifact:
    return ParquetArtifact(kind, table, decode_metadata(table.schema.metadata, str(path)), path)


def load_checkpoint(folder: Path) -> CheckpointFolder:
    """A checkpoint folder, verified against its manifest (``train.checkpoint.read_checkpoint``)."""
    from recast_cli.train.checkpoint import read_checkpoint

    try:
        _, state = read_checkpoint(folder)
        verified, problem = True, None
    except BadInput as exc:
        verified, problem = False, str(exc)
        state = _json_object(folder / "state.json")
    manifest = _json_object(folder / "manifest.json")
    step = manifest.get("step", state.get("step"))
    if not isinstance(step, int):
        match = re.fullmatch(r"step-(\d+)", folder.name)
        step = int(match[1]) if match else None
    return CheckpointFolder(folder, step, manifest, state, verified, problem)


def load_run(folder: Path) -> RunFolder:
    """A run folder: its record, the complete checkpoints (the latest one verified) and the metrics if any."""
    record = read_run(folder)
    found = list_checkpoints(folder)
    latest = load_checkpoint(found[-1][1]) if found else None
    metrics_path = folder / "metrics.parquet"
    metrics = _load_metrics(metrics_path) if metrics_path.is_file() else None
    return RunFolder(folder, record, tuple(step for step, _ in found), latest, metrics)


def _load_metrics(path: Path) -> ParquetArtifact:
    return _parquet_artifact("metrics", read_metrics(path), path)


def _load_image_scores(path: Path) -> ParquetArtifact:
    return _parquet_artifact("image-scores", read_image_scores(path), path)


def _load_judgements(path: Path) -> ParquetArtifact:
    return _parquet_artifact("judgements", read_judgements(path), path)


#: What ``recast inspect`` reads, by schema tag: the readers of ``recast_cli.artifacts`` (a run
#: folder is shown whole: its record, checkpoints and metrics), then the tags written elsewhere.
INSPECT_READERS: dict[str, Callable[[Path], Any]] = {
    **{tag: reader for tag, reader in READERS.items() if tag != RUN_SCHEMA},
    METRICS_SCHEMA: _load_metrics,
    IMAGE_SCORES_SCHEMA: _load_image_scores,
    JUDGEMENTS_SCHEMA: _load_judgements,
    RUN_SCHEMA: load_run,
    CHECKPOINT_SCHEMA: load_checkpoint,
}


def load_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Any artifact by its schema tag (Parquet metadata, safetensors header) or its folder's marker file."""
    tag, p = artifact_schema(path)
    if tag is None:
        raise BadInput(f"{p}: no 'schema' tag in its metadata; not a recast artifact")
    if tag not in INSPECT_READERS:
        raise BadInput(f"{p}: schema tag {tag!r} is not one recast inspect reads ({', '.join(INSPECT_READERS)})")
    return INSPECT_READERS[tag](p)


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file as found; {} when it is missing or not one (a checkpoint that fails to verify)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}

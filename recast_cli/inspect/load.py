"""Reading the artifacts ``recast inspect`` shows beyond ``artifacts.READERS``: metrics, image scores and
judgements tables with their metadata, and a run or checkpoint folder whole."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from recast_cli.artifacts import json_loads
from recast_cli.artifacts import (
    RunRecord,
    decode_metadata,
    list_checkpoints,
    read_image_scores,
    read_judgements,
    read_run,
)
from recast_cli.errors import BadInput
from recast_cli.artifacts.metrics import read_metrics


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
    metrics = load_metrics(metrics_path) if metrics_path.is_file() else None
    return RunFolder(folder, record, tuple(step for step, _ in found), latest, metrics)


def load_metrics(path: Path) -> ParquetArtifact:
    return _parquet_artifact("metrics", read_metrics(path), path)


def load_image_scores(path: Path) -> ParquetArtifact:
    return _parquet_artifact("image-scores", read_image_scores(path), path)


def load_judgements(path: Path) -> ParquetArtifact:
    return _parquet_artifact("judgements", read_judgements(path), path)


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file as found; {} when it is missing or not one (a checkpoint that fails to verify)."""
    try:
        value = json_loads(path.read_text(), str(path))
    except (OSError, UnicodeDecodeError, ValueError):  # ValueError: not JSON, or nested too deeply
        return {}
    return value if isinstance(value, dict) else {}

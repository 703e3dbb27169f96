"""What an artifact is: its file kind, the schema tag it declares, and the reader of each tag."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts.curve import CURVE_SCHEMA, read_curve
from recast_cli.artifacts.cells import CELL_SCHEMA, read_cell
from recast_cli.artifacts.evaluation import EVAL_SCHEMA, read_eval
from recast_cli.artifacts.gains import GAINS_SCHEMA, read_gains
from recast_cli.artifacts.image_scores import IMAGE_SCORES_SCHEMA, read_image_scores
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.artifacts.judgements import JUDGEMENTS_SCHEMA, read_judgements
from recast_cli.artifacts.metrics import METRICS_SCHEMA, read_metrics
from recast_cli.artifacts.positives import MANIFEST_NAME, POSITIVES_SCHEMA, Positives, read_positives
from recast_cli.artifacts.run import CHECKPOINT_SCHEMA, RECORD_NAME, RUN_SCHEMA, read_run
from recast_cli.artifacts.scores import SCORES_SCHEMA, read_scores
from recast_cli.artifacts.tables import current_tag, require_file
from recast_cli.artifacts.weights import WEIGHTS_SCHEMA, read_weights
from recast_cli.errors import BadInput


def artifact_kind(path: str | os.PathLike[str]) -> str:
    """'parquet' or 'safetensors' from the file's first bytes; BadInput for anything else."""
    p = Path(path)
    require_file(p)
    with open(p, "rb") as fh:
        head = fh.read(9)
    if head[:4] == b"PAR1":
        return "parquet"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise BadInput(f"{p}: neither a Parquet nor a safetensors file")


#: Folder artifacts, by the file that marks them (first match wins).
FOLDER_MARKERS = (
    (MANIFEST_NAME, POSITIVES_SCHEMA),
    (RECORD_NAME, RUN_SCHEMA),
    ("manifest.json", CHECKPOINT_SCHEMA),
)


def artifact_schema(path: str | os.PathLike[str]) -> tuple[str | None, Path]:
    """The schema tag an artifact declares, and the path to read it from.

    A folder is known by the file that marks it (:data:`FOLDER_MARKERS`); that marker file
    given on its own stands for its folder. A Parquet file declares its tag in the key-value
    metadata, a safetensors file in its header's ``__metadata__``; a file that declares none
    gives None; an earlier version's tag (``tables.EARLIER_TAGS``) is given as the current one. BadInput when the path is missing, unreadable, or neither a folder, Parquet
    nor safetensors.
    """
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{p}: no such file or folder")
    if p.is_dir():
        for marker, tag in FOLDER_MARKERS:
            if (p / marker).is_file():
                return tag, p
        markers = ", ".join(m for m, _ in FOLDER_MARKERS)
        raise BadInput(f"{p}: a folder that holds no recast artifact (none of {markers})")
    for marker, tag in FOLDER_MARKERS:
        if p.name == marker and marker.endswith(".json"):
            return tag, p.parent
    if artifact_kind(p) == "safetensors":
        try:
            with open(p, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                header = json_loads(fh.read(min(header_len, 100_000_000)), f"{p}: header")
        except (ValueError, UnicodeDecodeError):
            raise BadInput(f"{p}: not a readable safetensors file (bad header)") from None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        tag = meta.get("schema") if isinstance(meta, dict) else None
        return (tag if isinstance(tag, str) else None), p
    try:
        raw = pq.read_schema(p).metadata
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{p}: not a readable Parquet file ({first})") from None
    try:
        tag = json_loads((raw or {}).get(b"schema", b"null"), f"{p}: metadata 'schema'")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{p}: metadata 'schema' is not JSON") from None
    return (current_tag(tag) if isinstance(tag, str) else None), p


def _positives(path: Path) -> Positives:
    """A positives folder, given as the folder or as its manifest."""
    return read_positives(path if path.is_dir() else path.parent)


#: The reader of every schema this package owns, by tag: ``READERS[tag](path)`` takes the path
#: :func:`artifact_schema` returns. Not here: ``recast.checkpoint/1`` (verifying one loads its
#: tensors with torch: ``recast_cli.train.checkpoint``).
READERS: dict[str, Callable[[Path], Any]] = {
    GAINS_SCHEMA: read_gains,
    WEIGHTS_SCHEMA: read_weights,
    SCORES_SCHEMA: read_scores,
    POSITIVES_SCHEMA: _positives,
    EVAL_SCHEMA: read_eval,
    CURVE_SCHEMA: read_curve,
    CELL_SCHEMA: read_cell,
    RUN_SCHEMA: read_run,
    METRICS_SCHEMA: read_metrics,
    IMAGE_SCORES_SCHEMA: read_image_scores,
    JUDGEMENTS_SCHEMA: read_judgements,
}

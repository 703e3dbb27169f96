"""Every artifact schema of recast: atomic writes, provenance, and validation on read.

This package owns the file formats (ARCHITECTURE.md, "Artifacts"; the project's own description
is ``docs/artifacts.md``). Readers validate everything a later stage relies on and raise
:class:`~recast_cli.errors.BadInput` with one line that names the problem.

* ``io``: provenance (``Source``, ``Provenance``) and atomic output; ``tables``: Parquet and
  metadata helpers and the checks every reader shares;
* one module per schema: ``gains`` (``recast.gains/2``), ``weights`` (``recast.weights/1``),
  ``scores`` (``recast.scores/1``), ``positives`` (``recast.positives/1``), ``evaluation``
  (``recast.eval/1``), ``curve`` (``recast.curve/1``) and ``run`` (``recast.run/1``: run.json and
  the checkpoint listing);
* ``kinds``: what a path holds (``artifact_schema``) and the reader of each tag (``READERS``);
* ``outputs``: what an output path may replace (``claim_output``: only recast's own artifact of the
  same kind, never a user's file or a path inside another artifact folder) and its lock.

Code outside the package imports from here; the modules inside import each other by their
full names, never through this file.
"""

from recast_cli.artifacts.io import (
    PROVENANCE_KEYS, Provenance, Source, atomic_output, atomic_write_bytes, check_writable,
    clean_stale_temps, glob_escape, sha256_file,
)
from recast_cli.artifacts.jsonio import json_dumps, json_loads
from recast_cli.artifacts.locks import FolderLock
from recast_cli.artifacts.tables import (
    check_finite, current_tag, decode_metadata, open_parquet, read_parquet, require_columns, require_keys, require_schema,
    write_parquet,
)
from recast_cli.artifacts.gains import (
    GAINS_SCHEMA, GAIN_COLUMNS, GAIN_RUN_KEYS, MONOTONE_METHODS, SAMPLINGS, GainTable, read_gains,
    validate_gain_table, write_gains,
)
from recast_cli.artifacts.weights import (
    MARGINAL_TOL, MODES, WEIGHTS_SCHEMA, WeightMatrix, check_marginals, lambda_hat, read_weights, validate_weights,
    write_weights,
)
from recast_cli.artifacts.scores import (
    SCORES_SCHEMA, SCORE_COLUMNS, SCORE_RUN_KEYS, ScoreTable, read_scores, write_scores,
)
from recast_cli.artifacts.positives import (
    JOURNAL_NAME, MANIFEST_NAME, POSITIVES_SCHEMA, POSITIVE_COLUMNS, POSITIVE_REWARD_COLUMN, POSITIVE_SCALE_COLUMN, PositiveSample,
    Positives, read_positives, write_positives_manifest,
)
from recast_cli.artifacts.evaluation import (
    EVAL_COLUMNS, EVAL_KINDS, EVAL_MODES, EVAL_RUN_KEYS, EVAL_SCHEMA, EvalImage, EvalTable, read_eval, validate_eval,
    write_eval,
)
from recast_cli.artifacts.curve import (
    CURVE_COLUMNS, CURVE_RUN_KEYS, CURVE_SAMPLERS, CURVE_SCHEMA, CurveTable, read_curve, validate_curve, write_curve,
)
from recast_cli.artifacts.cells import CELL_COLUMNS, CELL_SCHEMA, CellTable, read_cell, validate_cell, write_cell
from recast_cli.artifacts.run import (
    CHECKPOINT_SCHEMA, RECORD_NAME, RUN_SCHEMA, RunRecord, RunRecordError, latest_checkpoint, list_checkpoints,
    read_run, step_dir, write_run,
)
from recast_cli.artifacts.metrics import METRICS_SCHEMA, read_metrics, write_metrics
from recast_cli.artifacts.image_scores import IMAGE_SCORES_SCHEMA, ImageScores, read_image_scores, write_image_scores
from recast_cli.artifacts.judgements import JUDGEMENTS_SCHEMA, Pair, Verdict, read_judgements, write_judgements
from recast_cli.artifacts.parts import bad_piece, finish_parts, open_parts, parts_dir, read_array_piece
from recast_cli.artifacts.kinds import FOLDER_MARKERS, READERS, artifact_kind, artifact_schema
from recast_cli.artifacts.outputs import (
    ENDPOINTS_SCHEMA, FIGURE_SCHEMA, IMAGE_SCHEMA, PNG_SCHEMA_KEY, REPORT_MARK, REPORT_SCHEMA, claim_output, claim_folder,
    png_text,
    refuse_foreign_file,
)


__all__ = [
    "PROVENANCE_KEYS", "FolderLock", "Provenance", "Source", "atomic_output", "atomic_write_bytes", "check_writable",
    "clean_stale_temps", "glob_escape", "json_dumps", "json_loads", "sha256_file", "check_finite", "current_tag", "decode_metadata",
    "open_parquet", "read_parquet", "require_columns", "require_keys", "require_schema", "write_parquet",
    "GAINS_SCHEMA", "GAIN_COLUMNS", "GAIN_RUN_KEYS", "MONOTONE_METHODS", "SAMPLINGS", "GainTable", "read_gains",
    "validate_gain_table", "write_gains", "MARGINAL_TOL", "MODES", "WEIGHTS_SCHEMA", "WeightMatrix",
    "check_marginals", "lambda_hat", "read_weights", "validate_weights", "write_weights", "SCORES_SCHEMA",
    "SCORE_COLUMNS", "SCORE_RUN_KEYS", "ScoreTable", "read_scores", "write_scores", "JOURNAL_NAME", "MANIFEST_NAME",
    "POSITIVES_SCHEMA", "POSITIVE_COLUMNS", "POSITIVE_REWARD_COLUMN", "POSITIVE_SCALE_COLUMN", "PositiveSample", "Positives",
    "read_positives", "write_positives_manifest", "EVAL_COLUMNS", "EVAL_KINDS", "EVAL_MODES", "EVAL_RUN_KEYS",
    "EVAL_SCHEMA", "EvalImage", "EvalTable", "read_eval", "validate_eval", "write_eval", "CURVE_COLUMNS",
    "CURVE_RUN_KEYS", "CURVE_SAMPLERS", "CURVE_SCHEMA", "CurveTable", "read_curve", "validate_curve", "write_curve",
    "CELL_COLUMNS", "CELL_SCHEMA", "CellTable", "read_cell", "validate_cell", "write_cell",
    "CHECKPOINT_SCHEMA", "RECORD_NAME", "RUN_SCHEMA", "RunRecord", "RunRecordError", "latest_checkpoint",
    "list_checkpoints", "read_run", "step_dir", "write_run", "FOLDER_MARKERS", "READERS", "artifact_kind",
    "artifact_schema", "METRICS_SCHEMA", "read_metrics", "write_metrics", "bad_piece", "finish_parts", "open_parts",
    "parts_dir", "read_array_piece", "IMAGE_SCORES_SCHEMA", "ImageScores",
    "read_image_scores", "write_image_scores", "JUDGEMENTS_SCHEMA", "Pair", "Verdict", "read_judgements",
    "write_judgements", "ENDPOINTS_SCHEMA", "FIGURE_SCHEMA", "IMAGE_SCHEMA", "PNG_SCHEMA_KEY", "REPORT_MARK", "REPORT_SCHEMA", "claim_output",
    "claim_folder", "png_text", "refuse_foreign_file",
]

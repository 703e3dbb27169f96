"""``recast report``: the paper's tables and figures from what stage 2 wrote (docs/method.md §7).

Inputs, any mix (docs/report.md):

* ``recast.eval/1`` tables (``recast evaluate``) → Tables 1 and 2 (base / static / no-Sink /
  ReCAST, mean ± std over training seeds, win counts over matched (λ, seed) pairs), Table 4
  (aggregate per λ), Tables 7–10 (per λ, with a Pareto verdict) and the sample grids;
* ``recast.run/1`` folders (``recast train``) → Fig. 1 from the run's W, training curves;
* ``recast.gains/2`` tables of the base policy and of trained checkpoints → Table 6, Fig. 5;
* ``recast.judgements/1`` files (``recast judge``) → Table 3 (position-debiased win rates);
* ``recast.curve/1`` tables (the 1-D world) → the two-timescale study's report instead (curves.py);
* ``recast.cell/1`` tables (``recast study``) → the batched study's report (cells.py).

Everything is read and checked before anything is written. ``report.md`` depends only on the
artifacts' contents — no timestamps, no absolute paths, everything sorted, numbers in fixed
formats — so regenerating it from the same artifacts gives the same bytes.

The modules, each importing only the ones before it: inputs (read and check), statistics,
tables and figures, build (the report of per-image evaluations), curves (of the 1-D world), and
this one (write); ``commands`` holds ``recast report`` and ``plot`` (``recast inspect`` is the ``inspect`` package).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from recast_cli.artifacts import (ENDPOINTS_SCHEMA, FIGURE_SCHEMA, REPORT_MARK, REPORT_SCHEMA, atomic_write_bytes,
                                  claim_output)
from recast_cli.artifacts.cells import DEFAULT_LOST_DELTA
from recast_cli import bounds
from recast_cli.errors import BadInput
from recast_cli.report.build import Report, build_report
from recast_cli.report.cells import ENDPOINTS, build_cell_report, is_cell_input, load_cells
from recast_cli.report.curves import build_curve_report
from recast_cli.report.inputs import check_inputs, is_curve_input, load_curve_inputs, load_inputs

REPORT_NAME = "report.md"


def write_report(report: Report, out_dir: Path) -> list[Path]:
    for figure in report.figures:  # every file it replaces is one of recast's, checked before any is written
        claim_output(out_dir / figure.file, FIGURE_SCHEMA)
    written = []
    for figure in report.figures:
        atomic_write_bytes(out_dir / figure.file, figure.png)
        written.append(out_dir / figure.file)
    atomic_write_bytes(out_dir / REPORT_NAME, f"{REPORT_MARK}\n{report.markdown}".encode("utf-8"))
    return [out_dir / REPORT_NAME, *written]


def make_report(paths: Sequence[str | Path], out_dir: str | Path, prompts: int = 4,
                lost_delta: float = DEFAULT_LOST_DELTA) -> list[Path]:
    """Read and check every input, build the report in memory, then write ``out_dir/report.md`` and the PNGs
    (a study's cells: with ``endpoints.csv``; a reward is lost below ``lost_delta``, ``report.rewards``)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: not a directory")
    bounds.check("grid_prompts", prompts, "--prompts")
    claim_output(out / REPORT_NAME, REPORT_SCHEMA, inputs=list(paths))
    if is_cell_input(paths):  # recast study: the batched engine's cells
        report, per_seed = build_cell_report(load_cells(paths), lost_delta)
        claim_output(out / ENDPOINTS, ENDPOINTS_SCHEMA)
        written = write_report(report, out)
        atomic_write_bytes(out / ENDPOINTS, per_seed)
        return [*written, out / ENDPOINTS]
    if is_curve_input(paths):  # the 1-D world (flow1d): curve tables instead of per-image evaluations
        return write_report(build_curve_report(load_curve_inputs(paths)), out)
    inputs = load_inputs(paths)
    check_inputs(inputs)
    return write_report(build_report(inputs, prompts), out)

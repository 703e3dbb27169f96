"""``recast report`` and ``plot``: the Typer commands over :mod:`recast_cli.report`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli.artifacts.cells import DEFAULT_LOST_DELTA
from recast_cli.errors import BadInput

out = Console()


def report_command(
    inputs: list[Path] = typer.Argument(..., help="Evaluation tables (recast.eval/1), run folders (recast.run/1), "
                                                  "gain tables (recast.gains/2) and judgement files "
                                                  "(recast.judgements/1), in any mix."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for report.md and the figures (PNG)."),
    prompts: int = typer.Option(4, "--prompts", help="Prompts per sample grid (0: no sample grids)."),
    lost_delta: float = typer.Option(DEFAULT_LOST_DELTA, "--lost-delta",
                                     help="A study's cells: a reward is lost when its final ODE value closes less "
                                          "than this share of its headroom over the base policy ([study] lost_delta)."),
) -> None:
    """Stage 2: the paper's tables and figures (Tables 1-4, 6-10; Fig. 1, 5; curves; samples) as Markdown + PNG."""
    from recast_cli.report import make_report

    if not 0 < lost_delta < 1:
        raise BadInput(f"--lost-delta must lie in (0, 1), got {lost_delta!r}")
    written = make_report(inputs, out_dir, prompts=prompts, lost_delta=lost_delta)
    Console().print(f"wrote {written[0]} and {len(written) - 1} figures", highlight=False)


def plot_command(
    out_path: Path = typer.Option(..., "--out", help="Output PNG."),
    gains: Optional[Path] = typer.Option(None, "--gains", help="Gain table (recast.gains/2)."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Weight matrix (recast.weights/1)."),
    d_curves: bool = typer.Option(False, "--d-curves", help="Plot the D curves with bootstrap bands instead."),
) -> None:
    """Write Figure 1 of the paper: per-step gains, mean-normalised gains and W (t/T from clean to noisy)."""
    from recast_cli.artifacts import FIGURE_SCHEMA, claim_output, read_gains, read_weights

    if gains is None and weights is None:
        raise BadInput("recast plot needs --gains, --weights or both")
    if d_curves and gains is None:
        raise BadInput("--d-curves needs --gains")
    claim_output(out_path, FIGURE_SCHEMA, inputs=[gains, weights])
    table = read_gains(gains) if gains is not None else None
    if d_curves:
        from recast_cli.report.figures import figure_d_curves, save_figure

        save_figure(figure_d_curves(table, title=str(gains)), out_path)
        out.print(f"wrote {out_path}")
        return
    matrix = read_weights(weights) if weights is not None else None
    from recast_cli.report.figures import figure_from_artifacts, save_figure

    save_figure(figure_from_artifacts(gains=table, weights=matrix,
                                      title=" + ".join(str(p) for p in (gains, weights) if p is not None)), out_path)
    out.print(f"wrote {out_path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
    app.command("plot")(plot_command)

"""``recast inspect``: the Typer command over :mod:`recast_cli.inspect`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli.errors import BadInput

out = Console()


def inspect_command(
    path: Path = typer.Argument(..., help="Any artifact: a gain, scores, evaluation, metrics, image-scores or "
                                          "judgements table (.parquet), a weight matrix (.safetensors), or a "
                                          "positives, run or checkpoint folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also write Fig. 1 (gains, normalised gains, W) as PNG."),
) -> None:
    """Show any artifact's schema, provenance and summary (per reward, per scorer, per checkpoint)."""
    from recast_cli.inspect.kinds import load_artifact, render, summarise

    if plot is not None:
        from recast_cli.artifacts import FIGURE_SCHEMA, claim_output

        claim_output(plot, FIGURE_SCHEMA, inputs=[path])
    kind, artifact = load_artifact(path)
    summary = summarise(kind, artifact)
    if plot is not None and kind.name not in ("gains", "weights"):
        raise BadInput(f"--plot draws Fig. 1 from a gain table or a weight matrix; {path} is a {kind.name} artifact")
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    else:
        render(summary, str(path), out)
    if plot is not None:
        from recast_cli.report.figures import figure_from_artifacts, save_figure

        save_figure(figure_from_artifacts(title=str(path), **{kind.name: artifact}), plot)
        out.print(f"wrote {plot}")


def register(app: typer.Typer) -> None:
    """Add ``inspect`` to the ``recast`` app."""
    app.command("inspect")(inspect_command)

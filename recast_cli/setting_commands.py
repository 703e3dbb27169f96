"""``recast check-setting`` and ``recast study-makefile``: the Typer commands over a setting file
(:mod:`recast_cli.settings_check` and :mod:`recast_cli.study`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from recast_cli.errors import BadInput

out = Console()


def study_makefile_command(
    setting: str = typer.Option(..., "--setting", help="Setting name (pipelines/NAME.toml) or a .toml path."),
    root: Path = typer.Option(None, "--root", help="Where the study's artifacts go (default artifacts/SETTING)."),
    recast: str = typer.Option("recast", "--recast", help="The recast executable the recipes call."),
) -> None:
    """Print the Make graph of a setting's study ([study] table): `make all SETTING=S` runs it."""
    from recast_cli.settings import load_setting
    from recast_cli.study import study_makefile

    name = load_setting(setting).name
    text = study_makefile(setting, root or Path("artifacts") / name, recast)
    if "\n\t" not in text:
        raise BadInput("the study has no steps")
    typer.echo(text)


def check_setting_command(
    setting: str = typer.Argument(..., help="Setting name (pipelines/NAME.toml) or a .toml path."),
    all_problems: bool = typer.Option(False, "--all", help="List every problem (one line each), not just the first."),
) -> None:
    """Check a setting and every model, prompt and data path it names (no weights are loaded)."""
    from rich.table import Table
    from rich.text import Text

    from recast_cli.settings_check import check_setting

    report = check_setting(setting, stop_at_first=not all_problems)
    table = Table(title=f"check-setting {report.file}", title_justify="left")
    for column in ("check", "subject", "result"):
        table.add_column(column, overflow="fold")
    for row in report.rows:
        table.add_row(*(Text(cell) for cell in row), style="red" if row[2] == "FAIL" else None)
    out.print(table)
    if report.problems:
        for line in report.problems:
            sys.stderr.write(f"recast: error: {line}\n")
        raise typer.Exit(2)
    out.print(f"{report.file.name}: all {len(report.rows)} checks passed")


def register(app: typer.Typer) -> None:
    app.command("study-makefile")(study_makefile_command)
    app.command("check-setting")(check_setting_command)

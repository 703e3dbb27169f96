"""``recast study-makefile``: the Typer command over :mod:`recast_cli.study.makefile`."""

from __future__ import annotations

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
    from recast_cli.setting.load import load_setting
    from recast_cli.study.makefile import study_makefile

    name = load_setting(setting).name
    text = study_makefile(setting, root or Path("artifacts") / name, recast)
    if "\n\t" not in text:
        raise BadInput("the study has no steps")
    typer.echo(text)


def register(app: typer.Typer) -> None:
    app.command("study-makefile")(study_makefile_command)

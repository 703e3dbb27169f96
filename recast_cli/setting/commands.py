"""``recast check-setting``: the Typer command over :mod:`recast_cli.setting.check`."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from recast_cli.errors import ERROR_LINE_LIMIT, cut

out = Console()


def check_setting_command(
    setting: str = typer.Argument(..., help="Setting name (pipelines/NAME.toml) or a .toml path."),
    all_problems: bool = typer.Option(False, "--all", help="List every problem (one line each), not just the first."),
) -> None:
    """Check a setting and every model, prompt and data path it names (no weights are loaded)."""
    from rich.table import Table
    from rich.text import Text

    from recast_cli.setting.check import check_setting

    report = check_setting(setting, stop_at_first=not all_problems)
    table = Table(title=f"check-setting {report.file}", title_justify="left")
    for column in ("check", "subject", "result"):
        table.add_column(column, overflow="fold")
    for row in report.rows:
        table.add_row(*(Text(cell) for cell in row), style="red" if row[2] == "FAIL" else None)
    out.print(table)
    if report.problems:
        for line in report.problems:
            sys.stderr.write(f"recast: error: {cut(line, ERROR_LINE_LIMIT)}\n")
        raise typer.Exit(2)
    out.print(f"{report.file.name}: all {len(report.rows)} checks passed")


def register(app: typer.Typer) -> None:
    app.command("check-setting")(check_setting_command)

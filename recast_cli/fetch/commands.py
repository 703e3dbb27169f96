"""``recast fetch SETTING``: the Typer command over :mod:`recast_cli.fetch.stage`."""

from __future__ import annotations

import typer
from rich.console import Console

out = Console()


def fetch_command(
    setting: str = typer.Argument(..., help="Setting name (pipelines/NAME.toml) or a .toml path."),
    trust_unpinned: bool = typer.Option(False, "--trust-unpinned", hidden=True,
                                        help="No longer needed: a prompt file's git blob id pins it (kept so that "
                                             "scripts that pass it still run)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Show what would be downloaded and its size; fetch nothing. Offline "
                                      "(HF_HUB_OFFLINE=1) it shows the plan without the sizes."),
) -> None:
    """Download the Hub models and prompt files a setting needs (the only command that downloads)."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)
    from rich.markup import escape
    from rich.table import Table

    from recast_cli.fetch.stage import (claim_prompt_file, fetch_model, fetch_prompt_file, make_derived, pin_text,
                                        plan_fetch, size_models)

    plan = plan_fetch(setting)
    offline = dry_run and _offline()
    if not offline:
        size_models(plan)
    table = Table(title=f"recast fetch {plan.setting.name}", title_justify="left")
    for column in ("what", "source", "files", "size", "pinned by", "needed by"):
        table.add_column(column, overflow="fold")
    for need in plan.models:
        if offline:
            table.add_row("model", escape(str(need.ref)), "?", "?", "Hub commit", escape(", ".join(need.needed_by)))
        else:
            table.add_row("model", escape(f"{need.ref} @ {need.commit}"), str(len(need.files)), _bytes(need.size),
                          "Hub commit", escape(", ".join(need.needed_by)))
    for path, pin in plan.prompts:
        table.add_row("prompts", escape(pin.url), "1", _bytes(pin.size) if pin.size is not None else "?",
                      pin_text(path, pin), escape(str(path)))
    for path, item in plan.derived:
        table.add_row("derived", escape(f"{item.recipe} of {', '.join(item.sources)}"), "1", "-", "its sources",
                      escape(str(path)))
    out.print(table)
    if offline:
        out.print(f"models: {len(plan.models)} repos; their files and sizes come from the Hub, and HF_HUB_OFFLINE=1 "
                  "is set: run the dry run with the network to see them")
        return
    total = sum(need.size for need in plan.models)
    out.print(f"models: {_bytes(total)} in {sum(len(n.files) for n in plan.models)} files (files already in the "
              "cache are not downloaded again)")
    if dry_run:
        return
    todo = [(path, pin) for path, pin in plan.prompts if claim_prompt_file(path, pin)]
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    # transient: the bars go when done (each file's line stays), so a failure is the one line on stderr
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        for need in plan.models:
            task = progress.add_task(str(need.ref), total=need.size)
            finished = [0]

            def done(size: int, task=task, finished=finished) -> None:
                finished[0] += size
                progress.update(task, completed=finished[0])

            snapshot = fetch_model(need, lambda n, task=task: progress.advance(task, n), done)
            progress.console.print(f"{need.ref}: {snapshot}")
        for path, pin in todo:
            task = progress.add_task(pin.name, total=None)
            fetch_prompt_file(path, pin, lambda n, task=task: progress.advance(task, n))
            progress.update(task, total=progress.tasks[task].completed)
            progress.console.print(f"{pin.name}: {path} (checked)")
    for path, pin in plan.prompts:
        if (path, pin) not in todo:
            out.print(f"{pin.name}: {path} is there and matches its pins")
    for path, item in plan.derived:
        out.print(f"{item.name}: {'wrote' if make_derived(path, item, plan.p) else 'kept'} {path}")
    out.print(f"{plan.setting.name}: everything fetched")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _bytes(n: int) -> str:
    """A size in decimal units, as the Hub shows them."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1000 or unit == "GB":
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def register(app: typer.Typer) -> None:
    app.command("fetch")(fetch_command)

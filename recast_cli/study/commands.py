"""``recast study`` (the batched runner, :mod:`recast_cli.study.runner`) and ``recast study-makefile`` (the
Make route, :mod:`recast_cli.study.makefile`): the Typer commands of a setting's ``[study]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli.errors import BadInput, cut

out = Console()


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """``--seeds 0:256`` (a half-open range) or ``--seeds 3,5,8`` → the seeds; None → the setting's.
    A range is checked as numbers (``bounds.seed_range``) before it is built."""
    if text is None:
        return None
    from recast_cli import bounds

    ranged = ":" in text
    try:
        numbers = [int(x) for x in text.split(":" if ranged else ",")]
        lo, hi = numbers if ranged else (0, 0)
    except ValueError:  # not integers, or a range of other than two
        raise BadInput(f"--seeds {cut(text)!r}: expected LO:HI (half-open) or a comma-separated list") from None
    seeds = tuple(bounds.seed_range(lo, hi, "--seeds")) if ranged else tuple(numbers)
    if not seeds or len(set(seeds)) != len(seeds):
        raise BadInput(f"--seeds {cut(text)!r}: needs distinct seeds")
    bounds.check("study_seeds", len(seeds), "--seeds (how many)")
    for seed in (min(seeds), max(seeds)):
        bounds.check("seed", seed, "--seeds")
    return seeds


def study_command(
    setting: str = typer.Argument(..., help="A flow1d setting with a [study] table (name or .toml path)."),
    out_dir: Path = typer.Option(..., "--out", help="Study folder: gains/, W/, cells/ (recast.cell/1), report/."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Training seeds: LO:HI or a list (default: [study] seeds)."),
    overrides: list[str] = typer.Option([], "--set", help="Any [train] option for every cell: --set KEY=VALUE."),
    shard: Optional[str] = typer.Option(None, "--shard", help="i/n: run every n-th cell from the i-th (several "
                                                               "processes share a study; the report waits for all)."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write OUT/report/ from the cells at the end."),
    force: bool = typer.Option(False, "--force", help="Recompute the cells, gains and W in OUT that other inputs "
                                                      "made (a changed setting, or an older recast) instead of "
                                                      "refusing them; only recast's own files there are replaced."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Stage 2 of the 1-D world at many seeds: every budget × arm × G of [study] as one batched cell each."""
    from recast_cli import bounds
    from recast_cli.study.runner import cell_footprint, pending_cells, plan_study, run_study
    from recast_cli.estimate.config import parse_shard

    part = parse_shard(shard)
    from recast_cli import threads

    threads.share_cores(part[1])  # n shards at once: one n-th of the cores each (recast_cli/threads.py)
    plan = plan_study(setting, out_dir, parse_seeds(seeds), overrides)
    counts, memory = cell_footprint(plan)  # one joint bound per cell, before anything is allocated
    bounds.check_product("study_cell", {k: counts[k] for k in ("seeds", "rollouts per step", "T")})
    bounds.check_bytes("study_cell_bytes", memory, counts)
    paths = run_study(plan, quiet=quiet, shard=part, force=force)
    missing = pending_cells(plan)  # other shards' cells not yet made, or not yet remade of these inputs
    out.print(f"{len(paths) - len(missing)} of {len(paths)} cells × {len(plan.seeds)} seeds → {out_dir / 'cells'}")
    if missing:
        out.print(f"the report waits for the other shards' {len(missing)} cells")
    elif report:
        from recast_cli.report import make_report

        written = make_report(paths, out_dir / "report", lost_delta=plan.study.lost_delta)
        out.print(f"wrote {written[0]}")


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
    app.command("study")(study_command)
    app.command("study-makefile")(study_makefile_command)

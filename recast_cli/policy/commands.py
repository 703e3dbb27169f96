"""``recast tiny-model``: the Typer command over :mod:`recast_cli.policy.tiny`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli import bounds
from recast_cli.policy.families import FAMILIES

out = Console()


def tiny_model_command(
    family: str = typer.Option(..., "--family", help=f"{' | '.join(FAMILIES)}: the pipeline's architecture."),
    out_dir: Path = typer.Option(..., "--out", help="A new or empty folder for the pipeline (diffusers layout)."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Prompts file: its words join the vocabulary."),
) -> None:
    """Write a random-initialised, CPU-sized pipeline of a family's real architecture (smoke tests)."""
    from recast_cli.policy.tiny import write_tiny_model
    from recast_cli.setting.prompts import read_prompt_file

    bounds.check("seed", seed, "--seed")
    words = read_prompt_file(prompts)[0] if prompts is not None else []
    record = write_tiny_model(family, out_dir, seed=seed, prompts=words)
    sizes = ", ".join(f"{name} {count:,}" for name, count in sorted(record["parameters"].items()))
    out.print(f"wrote {out_dir} ({record['pipeline']}, random weights; parameters: {sizes})", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("tiny-model")(tiny_model_command)

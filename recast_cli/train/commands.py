"""``recast train``: the Typer command over ``recast_cli.train.stage``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

out = Console()


def train_command(
    setting: str = typer.Option(..., "--setting", help="Setting name (pipelines/NAME.toml) or a .toml path."),
    weights: str = typer.Option(..., "--weights",
                                help="W from `recast solve-w` (its mode: recast, nosink or static), or 'static' "
                                     "to build the static W from the setting's lambda on the sampler's grid."),
    out_dir: Path = typer.Option(..., "--out", help="Run folder (recast.run/1)."),
    seed: Optional[int] = typer.Option(None, help="Run seed (prompt order, sampling noise, LoRA init)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's latest checkpoint (exactly)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Train until this many steps in all."),
    init: Optional[str] = typer.Option(None, "--init", help="Start from this checkpoint's LoRA (a run or checkpoint "
                                                            "folder): the warmup → training hand-over."),
    lam: Optional[str] = typer.Option(None, "--lambda", help="Budgets, one per reward, e.g. 1,1,2 (default: the setting's)."),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="Images per prompt G."),
    prompts_per_step: Optional[int] = typer.Option(None, "--prompts-per-step", help="Groups per step (global)."),
    learning_rate: Optional[float] = typer.Option(None, "--lr"),
    beta_kl: Optional[float] = typer.Option(None, "--beta-kl", help="Weight of the KL to the reference policy."),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Checkpoint every N steps."),
    overrides: list[str] = typer.Option([], "--set", help="Any [train] option: --set KEY=VALUE (TOML value)."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: what accelerate picks)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    progress: str = typer.Option("auto", "--progress",
                                 help="auto: a bar on a terminal, one plain line per step otherwise; lines: one "
                                      "line per step, prefixed with the run (several runs sharing one log, "
                                      "make all); none: as --quiet."),
) -> None:
    """Stage 2: train with W frozen (Flow-GRPO-style; static, ReCAST and no-Sink differ only in W)."""
    from recast_cli.errors import BadInput
    from recast_cli.train.stage import train

    flags = {"seed": seed, "max_steps": max_steps, "group_size": group_size, "prompts_per_step": prompts_per_step,
             "learning_rate": learning_rate, "beta_kl": beta_kl, "save_every": save_every, "lam": lam}
    if progress not in ("auto", "lines", "none"):
        raise BadInput(f"--progress must be auto, lines or none, got {progress!r}")
    line = train(setting, weights, out_dir, resume=resume, init=init, overrides=overrides, flags=flags, device=device,
                 quiet=quiet or progress == "none", lines=progress == "lines")
    if line is not None:
        out.print(line)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)

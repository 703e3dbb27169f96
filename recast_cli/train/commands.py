"""``recast train``: the Typer command over ``recast_cli.train.trainer``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli.errors import BadInput

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
) -> None:
    """Stage 2: train with W frozen (Flow-GRPO-style; static, ReCAST and no-Sink differ only in W)."""
    from recast_cli.settings import load_setting
    from recast_cli.train.config import apply_overrides, config_from_setting
    from recast_cli.train.plan import plan_run
    from recast_cli.train.trainer import Trainer

    s = load_setting(setting)
    cfg = config_from_setting(s.raw, s.file)
    flags = {"seed": seed, "max_steps": max_steps, "group_size": group_size, "prompts_per_step": prompts_per_step,
             "learning_rate": learning_rate, "beta_kl": beta_kl, "save_every": save_every,
             "lam": lam}
    cfg = apply_overrides(cfg, overrides, flags)
    if device not in (None, "cpu", "cuda"):
        raise BadInput(f"--device must be cpu or cuda, got {device!r}")
    plan = plan_run(setting, cfg, weights, out_dir, resume, init, device)
    trainer = Trainer(plan, quiet=quiet)
    try:
        _train(trainer, plan, cfg, out_dir)
    finally:
        trainer.close()


def _train(trainer, plan, cfg, out_dir) -> None:
    start = trainer.step
    if start >= cfg.max_steps:
        out.print(f"{out_dir} is already at step {start} (max_steps {cfg.max_steps}); nothing to do")
        return
    trainer.train()
    if trainer.rank == 0:
        rows = {r["step"]: r["aggregate"] for r in trainer.metrics.rows}
        steps = sorted(rows)
        # one pass over the prompts: per-step means differ by prompt, pass means compare
        k = min(-(-len(plan.prompts) // cfg.prompts_per_step), max(len(steps) // 2, 1))
        head, tail = steps[:k], steps[-k:]
        mean = lambda s: sum(rows[i] for i in s) / len(s)  # noqa: E731
        span = lambda s: f"step {s[0]}" if len(s) == 1 else f"steps {s[0]}-{s[-1]}"  # noqa: E731
        what = (f"{span(head)}: {mean(head):.4f}" if head == tail else
                f"mean over {span(head)}: {mean(head):.4f}, {span(tail)}: {mean(tail):.4f}")
        trained = f"step {trainer.step}" if trainer.step == start + 1 else f"steps {start + 1}..{trainer.step}"
        out.print(f"trained {trained} ({plan.weights.mode} W) → {out_dir}; aggregate reward Σλ·r, {what}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)

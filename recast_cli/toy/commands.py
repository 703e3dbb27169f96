"""``recast toy pretrain`` and ``recast toy quality``: the Typer commands over :mod:`recast_cli.toy`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from recast_cli import bounds

out = Console()

toy_app = typer.Typer(help="The toy world: pretraining its tiny SD3-architecture model.", no_args_is_help=True,
                      rich_markup_mode=None)


@toy_app.command("pretrain")
def toy_pretrain_command(
    out_dir: Path = typer.Option(Path("pipelines/toy/model"), "--out", help="Model folder to write."),
    work: Path = typer.Option(Path("artifacts/toy-pretrain"), help="Checkpoints; rerun to resume."),
    seed: int = typer.Option(0),
    vae_steps: int = typer.Option(1000, help="Autoencoder steps."),
    steps: int = typer.Option(8000, help="Flow-matching steps of the transformer."),
    batch: int = typer.Option(48),
) -> None:
    """Train the toy model on renderer images (resumable), write it in diffusers layout."""
    from recast_cli.toy.pretrain import PretrainConfig, pretrain

    bounds.check_all(("seed", "--seed", seed), ("training_steps", "--vae-steps", vae_steps),
                     ("training_steps", "--steps", steps), ("batch", "--batch", batch))
    cfg = PretrainConfig(seed=seed, vae_steps=vae_steps, steps=steps, batch=batch)
    command = (f"recast toy pretrain --out {out_dir} --work {work} --seed {seed} --vae-steps {vae_steps} "
               f"--steps {steps} --batch {batch}")
    provenance = pretrain(out_dir, work, cfg, command)
    out.print(f"wrote {out_dir} (final losses: {provenance['final_loss']})")


@toy_app.command("quality")
def toy_quality_command(
    model: Path = typer.Option(Path("pipelines/toy/model"), help="Toy model folder."),
    n: int = typer.Option(4, "--n", help="Images per prompt (24 prompts)."),
    seed: int = typer.Option(1000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Toy rewards on renderer images vs the model's samples vs a random-initialised model."""
    import tempfile

    from recast_cli.evaluate.toy_quality import TOY_REWARDS, quality

    bounds.check_all(("quality_images", "--n", n), ("seed", "--seed", seed))
    with tempfile.TemporaryDirectory() as work:
        result = quality(model, n=n, seed=seed, work=work)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    table = Table(title=f"toy rewards, mean over 24 prompts x {n} images (ODE samples, 10 steps, CFG 4.5)")
    table.add_column("images")
    for name in TOY_REWARDS:
        table.add_column(name, justify="right")
    for label, means in result.items():
        table.add_row(label, *(f"{means[name]:.3f}" for name in TOY_REWARDS))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(toy_app, name="toy")

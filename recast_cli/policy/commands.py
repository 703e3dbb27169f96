"""``recast sample`` and ``recast tiny-model``: the Typer commands over :mod:`recast_cli.policy`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli import bounds
from recast_cli.errors import BadInput

out = Console()


def sample_command(
    out_dir: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    setting: str = typer.Option("toy", help="Setting name (pipelines/NAME.toml) or a .toml path."),
    prompt: list[str] = typer.Option(..., "--prompt", help="Prompt (repeat for several)."),
    n: int = typer.Option(4, "--n", help="Images per prompt."),
    seed: int = typer.Option(0, help="Image i of a prompt uses seed + i."),
    steps: Optional[int] = typer.Option(None, help="Sampling steps (default: the setting's)."),
    guidance_scale: Optional[float] = typer.Option(None, "--cfg", help="CFG scale (default: the setting's)."),
    noise_level: float = typer.Option(0.0, help="SDE noise level a (0: deterministic ODE)."),
    batch: int = typer.Option(8, help="Images per model batch."),
    device: Optional[str] = typer.Option(None, help="torch device (default: cuda if available)."),
) -> None:
    """Sample images from a setting's policy and write them as PNGs."""
    from recast_cli.policy.sample import check_outputs, sample_images
    from recast_cli.setting.load import build_policy, check_prompts, load_setting

    bounds.check_all(("images_per_prompt", "--n", n), ("seed", "--seed", seed), ("steps", "--steps", steps),
                     ("batch", "--batch", batch))
    if noise_level < 0:
        raise BadInput(f"--noise-level must be >= 0, got {noise_level}")
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"cannot write into {out_dir}: it is not a directory")
    spec = load_setting(setting).policy
    check_prompts(spec, prompt)
    check_outputs(prompt, n, out_dir, seed=seed)
    policy = build_policy(spec, device=device, steps=steps, guidance_scale=guidance_scale)
    paths = sample_images(policy, prompt, n, out_dir, seed=seed, noise_level=noise_level, batch=batch)
    out.print(f"wrote {len(paths)} images to {out_dir}")


def tiny_model_command(
    family: str = typer.Option(..., "--family", help="sd3 | flux | qwenimage: the pipeline's architecture."),
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
    app.command("sample")(sample_command)
    app.command("tiny-model")(tiny_model_command)

"""``recast sample`` (a setting's policy or a run's: :mod:`recast_cli.policy.sample`) and ``recast tiny-model``
(:mod:`recast_cli.policy.tiny`): the Typer commands of the policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from recast_cli import bounds
from recast_cli.errors import BadInput
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


def sample_command(
    out_dir: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    setting: Optional[str] = typer.Option(None, help="Setting name (pipelines/NAME.toml) or a .toml path "
                                                     "(default: toy, or the setting --run trained)."),
    run: Optional[Path] = typer.Option(None, "--run", help="A recast train run: sample its latest checkpoint "
                                                           "(its LoRA on the setting's model)."),
    checkpoint: Optional[int] = typer.Option(None, "--checkpoint", help="With --run: the step of the checkpoint."),
    prompt: list[str] = typer.Option(..., "--prompt", help="Prompt (repeat for several)."),
    n: int = typer.Option(4, "--n", help="Images per prompt."),
    seed: int = typer.Option(0, help="Image i of a prompt uses seed + i."),
    steps: Optional[int] = typer.Option(None, help="Sampling steps (default: the setting's)."),
    guidance_scale: Optional[float] = typer.Option(None, "--cfg", help="CFG scale (default: the setting's)."),
    noise_level: float = typer.Option(0.0, help="SDE noise level a (0: deterministic ODE)."),
    batch: int = typer.Option(8, help="Images per model batch."),
    device: Optional[str] = typer.Option(None, help="torch device (default: cuda if available)."),
    grid: bool = typer.Option(False, "--grid", help="Also write OUT/grid.png: every image, a row per prompt."),
    allow_setting_change: bool = typer.Option(False, "--allow-setting-change",
                                              help="With --run: use the run's setting although its [policy] or "
                                                   "[world] changed since the run trained (recorded in each PNG)."),
) -> None:
    """Sample images from a setting's policy, or a trained run's, and write them as PNGs."""
    from recast_cli.artifacts.run import SETTING_CHANGES
    from recast_cli.policy.sample import check_outputs, sample_images, write_grid
    from recast_cli.setting.load import build_policy, check_prompts

    bounds.check_all(("images_per_prompt", "--n", n), ("seed", "--seed", seed), ("steps", "--steps", steps),
                     ("batch", "--batch", batch))
    if noise_level < 0:
        raise BadInput(f"--noise-level must be >= 0, got {noise_level}")
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"cannot write into {out_dir}: it is not a directory")
    found, spec, changes = _sample_source(run, setting, checkpoint, allow_setting_change)
    check_prompts(spec, prompt)
    check_outputs(prompt, n, out_dir, seed=seed, grid=grid)
    policy = build_policy(spec, device=device, steps=steps, guidance_scale=guidance_scale)
    if found is not None:
        from recast_cli.policy.lora import load_lora_into_policy

        load_lora_into_policy(policy, found.folder)
    notes = {SETTING_CHANGES: json.dumps(changes)} if changes else None
    paths = sample_images(policy, prompt, n, out_dir, seed=seed, noise_level=noise_level, batch=batch, notes=notes)
    out.print(f"wrote {len(paths)} images to {out_dir}")
    if grid:
        out.print(f"wrote {write_grid(paths, n, out_dir, notes=notes)}")


def _sample_source(run: Path | None, setting: str | None, checkpoint: int | None, allow_setting_change: bool):
    """What ``recast sample`` draws from: (the run's checkpoint or None, the policy, what of the run's setting
    changed since it trained and was accepted). BadInput for a policy without images (the 1-D world's) and
    for a run's setting edited since it trained, unless ``allow_setting_change``."""
    from recast_cli.artifacts.run import ALLOW_SETTING_CHANGE, refuse_setting_change, run_checkpoint
    from recast_cli.setting.load import ANALYTIC_KINDS, load_setting, policy_inputs, policy_values

    found, changes = None, []
    if run is not None:
        if setting is not None:
            raise BadInput("give --run (it names its setting) or --setting, not both")
        found = run_checkpoint(run, f"--run {run}", step=checkpoint)
    elif checkpoint is not None:
        raise BadInput("--checkpoint selects a checkpoint of --run")
    elif allow_setting_change:
        raise BadInput(f"{ALLOW_SETTING_CHANGE} applies to --run (a run's setting edited since it trained)")
    loaded = load_setting(found.record.setting if found is not None else setting or "toy")
    if loaded.policy.kind in ANALYTIC_KINDS:
        what = f"--run {run} trained" if found is not None else f"setting {loaded.name!r} holds"
        raise BadInput(f"{what} a {loaded.policy.kind} policy, whose samples are points of its 1-D world, not "
                       "images: recast sample draws images; `recast evaluate` gives its reward curves")
    if found is not None:
        changes = refuse_setting_change(found.record.config, policy_inputs(loaded), policy_values(loaded),
                                        where=f"--run {run}", setting=loaded.file, since="the run trained",
                                        allow=allow_setting_change)
    return found, loaded.policy, changes


def register(app: typer.Typer) -> None:
    app.command("sample")(sample_command)
    app.command("tiny-model")(tiny_model_command)

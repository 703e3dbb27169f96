"""``recast sample-positive``: the Typer command over :mod:`recast_cli.positives.collect` and its sources."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from recast_cli import bounds
from recast_cli.errors import BadInput
from recast_cli.positives.sources import USAGE, parse_source

out = Console()
err = Console(stderr=True)

SOURCES = USAGE  # the --help line of --source, from the registry


def sample_positive_command(
    source: str = typer.Option(..., "--source", help=f"Where positives come from: {SOURCES}."),
    n: int = typer.Option(..., "--n", help="Positives per prompt (per reward for --source self)."),
    out_dir: Path = typer.Option(..., "--out", help="Positives folder (recast.positives/1); rerun to resume."),
    setting: Optional[str] = typer.Option(None, "--setting", help="Setting name or .toml: its prompts, policy "
                                                                  "and resolution."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Prompts file, one per line (overrides the "
                                                                   "setting's prompts)."),
    resolution: Optional[int] = typer.Option(None, help="Image side R (default: the setting policy's)."),
    seed: int = typer.Option(0, help="Image s of prompt p uses seed + p*100000 + s (seeded sources)."),
    rewards: Optional[str] = typer.Option(None, help="self: rewards, comma-separated (one positive set each)."),
    draws: Optional[int] = typer.Option(None, help="self: π^old draws per prompt S (default 8 N)."),
    beta: float = typer.Option(1.0, help="self: temperature β of the tilt exp(r̃/β) (E2)."),
    standardise: bool = typer.Option(True, "--standardise/--raw", help="self: tilt the per-prompt standardised "
                                                                       "reward r̃ = (r - mean)/std, or the raw r."),
    noise_level: Optional[float] = typer.Option(None, help="self: SDE noise level a of π^old (default: the "
                                                           "setting's)."),
    steps: Optional[int] = typer.Option(None, help="self / diffusers: sampling steps (default: the setting's / "
                                                   "the pipeline's)."),
    cfg: Optional[float] = typer.Option(None, "--cfg", help="self / diffusers: CFG scale."),
    batch: int = typer.Option(8, help="self / diffusers: images per model call."),
    device: Optional[str] = typer.Option(None, help="self / diffusers: torch device (default: cuda if available)."),
    model: Optional[str] = typer.Option(None, help="openai / gemini: model (default gpt-image-1.5 / "
                                                   "gemini-3-pro-image-preview)."),
    size: Optional[str] = typer.Option(None, help="openai: size (e.g. 1024x1024); gemini: aspect ratio (1:1)."),
    quality: Optional[str] = typer.Option(None, help="openai: quality (low | medium | high | auto)."),
    concurrency: int = typer.Option(4, help="openai / gemini: requests in flight at most."),
    retries: int = typer.Option(5, help="openai / gemini: retries after a 429, 5xx, timeout or broken answer."),
    timeout: float = typer.Option(300.0, help="openai / gemini: seconds per request."),
    backoff: float = typer.Option(1.0, help="openai / gemini: seconds before the first retry (doubled per "
                                            "retry, at most 60)."),
) -> None:
    """Write π⁺ surrogate images for every prompt (docs/method.md §4, "Positive samples"; E2)."""
    from recast_cli.positives.collect import IncompleteRun, collect

    bounds.check_all(("images_per_prompt", "--n", n), ("resolution", "--resolution", resolution),
                     ("seed", "--seed", seed), ("draws", "--draws", draws), ("steps", "--steps", steps),
                     ("batch", "--batch", batch), ("concurrency", "--concurrency", concurrency),
                     ("retries", "--retries", retries))
    if not timeout > 0 or backoff < 0:
        raise BadInput("--backoff must be >= 0 and --timeout > 0")
    kind, arg = parse_source(source)
    spec_setting = _load_setting(setting)
    prompt_list, inputs = _prompts(spec_setting, prompts)
    size_r = _resolution(spec_setting, resolution)
    flags = {"rewards": rewards, "draws": draws, "beta": beta, "standardise": standardise, "noise_level": noise_level,
             "steps": steps, "cfg": cfg, "batch": batch, "model": model, "size": size, "quality": quality,
             "concurrency": concurrency, "retries": retries, "timeout": timeout, "backoff": backoff}
    src = kind.build(arg, {**flags, "n": n, "device": device}, spec_setting, size_r)
    config = {"source": source, "n": n, "resolution": size_r, "seed": seed, "setting": setting,
              "prompts": str(prompts) if prompts else None,
              "options": {k: flags[k] for k in kind.flags}}
    try:
        report = collect(src, prompt_list, n, out_dir, size_r, seed=seed, config=config, sources=inputs, console=err)
    except IncompleteRun as exc:
        _summary(exc.report, source)
        err.print(f"recast: {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    _summary(report, source)
    out.print(f"wrote {report.out}")


def _load_setting(setting: str | None):
    if setting is None:
        return None
    from recast_cli.setting.load import load_setting

    return load_setting(setting)


def _prompts(setting, prompts_file: Path | None) -> tuple[list[str], list[Path]]:
    """Prompts from --prompts, else the setting's ``[positives] prompts`` file, else the toy vocabulary."""
    from recast_cli.positives.config import config_from_setting as positives_config
    from recast_cli.setting.prompts import read_prompt_file
    from recast_cli.setting.load import check_prompts

    if prompts_file is None and setting is None:
        raise BadInput("give --setting S or --prompts FILE")
    sources: list[Path] = []
    if prompts_file is not None:
        found, sources = read_prompt_file(prompts_file)[0], [prompts_file]
    else:
        path = positives_config(setting).prompts
        if path is not None:
            found, sources = read_prompt_file(path)[0], [path]
        elif setting.policy.prompt_check == "toy":
            from recast_cli.toy.renderer import all_prompts

            found = all_prompts()
        else:
            raise BadInput(f"{setting.file} names no prompts ([positives] prompts = FILE); give --prompts FILE")
    if setting is not None:
        check_prompts(setting.policy, found)
        sources.append(setting.file)
    return found, sources


def _resolution(setting, resolution: int | None) -> int:
    """--resolution, else the setting policy's, else its model's native size (transformer x VAE configs)."""
    if resolution is not None:
        return resolution
    if setting is None:
        raise BadInput("--prompts without --setting needs --resolution R")
    spec = setting.policy
    if spec.kind == "gmm1d":
        raise BadInput(f"the {setting.name} setting's policy (gmm1d) makes no images")
    if spec.resolution is not None:
        return int(spec.resolution)
    folder = spec.folder()
    try:
        transformer = json.loads((folder / "transformer" / "config.json").read_text())
        vae = json.loads((folder / "vae" / "config.json").read_text())
        return int(transformer["sample_size"]) * 2 ** (len(vae["block_out_channels"]) - 1)
    except (OSError, KeyError, TypeError, ValueError):
        raise BadInput(f"cannot read the resolution of {folder}; give --resolution R") from None


def _summary(report, source: str) -> None:
    table = Table(title=f"positives: {source} → {report.out}", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    refused = ", ".join(str(p) for p in sorted(report.refused)) or "none"
    for label, value in (("prompts", report.prompts), ("images in manifest", report.rows or "—"),
                         ("made now", report.new), ("kept from before", report.kept),
                         ("made again (sha256 mismatch)", report.redone), ("refused prompts", refused),
                         ("failed", len(report.failures)), ("seconds", f"{report.seconds:.1f}")):
        table.add_row(label, str(value))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("sample-positive")(sample_positive_command)


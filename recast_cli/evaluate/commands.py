"""``recast evaluate`` (``recast_cli.evaluate.stage``), ``recast serve-judges`` and ``recast sample`` (a setting's
policy or a run's images: ``recast_cli.policy.sample``): the Typer commands of evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from recast_cli import bounds
from recast_cli.errors import BadInput

out = Console()


def evaluate_command(
    run: Optional[Path] = typer.Option(None, "--run", help="A recast train run folder: evaluate its checkpoint "
                                                           "with the run's setting."),
    setting: Optional[str] = typer.Option(None, "--setting", help="Evaluate the base model of this setting "
                                                                  "(pipelines/NAME.toml or a .toml path)."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Output Parquet (recast.eval/1); images go to "
                                                                "OUT.images/."),
    add_judges: Optional[Path] = typer.Option(None, "--add-judges",
                                              help="An evaluation table: score the judges (--judges, else the "
                                                   "setting's) on its saved images and add them to it (make judges)."),
    checkpoint: Optional[int] = typer.Option(None, "--checkpoint",
                                             help="Step of the run's checkpoint (default: the latest)."),
    judges: Optional[str] = typer.Option(None, "--judges", help="Held-out judges, comma-separated (default: the "
                                                                "setting's [evaluate] judges; '' for none)."),
    n: Optional[int] = typer.Option(None, "--n", help="Images per prompt (default: [evaluate] n, else 4)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Base seed: image k of prompt p uses "
                                                            "seed + 100000·p + k (default 10000)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Images per sampling and scoring chunk."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)."),
    checkpoints: Optional[str] = typer.Option(None, "--checkpoints", help="flow1d: all, latest or steps 10,20 of "
                                                                          "--run (a recast.curve/1 table)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", help="flow1d: sde (the training sampler), ode, "
                                                                  "or sde,ode (default ode)."),
    allow_setting_change: bool = typer.Option(False, "--allow-setting-change",
                                              help="Use the run's setting (with --add-judges: the evaluation's) "
                                                   "although its [policy] or [world] changed since the run trained "
                                                   "(the images were made); recorded in the output."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Evaluate the base model or a trained run: ODE samples of held-out prompts, rewards and judges per image
    (in the 1-D world flow1d: mean rewards per checkpoint and sampler, a recast.curve/1 table)."""
    from recast_cli.errors import BadInput
    from recast_cli.evaluate.stage import EvalPlan, images_dir, parse_judges, run_evaluation

    bounds.check_all(("checkpoint", "--checkpoint", checkpoint), ("images_per_prompt", "--n", n),
                     ("seed", "--seed", seed), ("batch", "--batch-size", batch_size))
    if add_judges is not None:
        from recast_cli.evaluate.judges import add_judges as add

        given = [flag for flag, value in (("--run", run), ("--setting", setting), ("--out", out_path),
                                          ("--checkpoint", checkpoint), ("--n", n), ("--seed", seed),
                                          ("--checkpoints", checkpoints), ("--sampler", sampler)) if value is not None]
        if given:
            raise BadInput(f"--add-judges scores the images an evaluation saved: {', '.join(given)} do not apply")
        table = add(add_judges, None if judges is None else parse_judges(judges), batch_size, device, quiet,
                    allow_setting_change=allow_setting_change)
        judged = [s for s, k in zip(table.scorers, table.kinds) if k == "judge"]
        out.print(f"{add_judges}: {len(table.images)} images, judges {', '.join(judged)} "
                  + ", ".join(f"{s} {table.column(s).mean():.4f}" for s in judged))
        return
    if out_path is None:
        raise BadInput("--out is required (or --add-judges EVAL)")
    plan, table = run_evaluation(run, setting, out_path, checkpoint=checkpoint, checkpoints=checkpoints,
                                 sampler=sampler, judges=judges, n=n, seed=seed, batch_size=batch_size, device=device,
                                 quiet=quiet, allow_setting_change=allow_setting_change)
    if not isinstance(plan, EvalPlan):
        _print_curve(plan, table, out_path)
        return
    what = "base model" if plan.target.run is None else f"{plan.target.mode} run, step {plan.target.step}"
    summary = Table(title=f"{plan.target.setting.name} ({what}): {len(table.images)} images "
                          f"({len(plan.prompts)} prompts x {plan.cfg.n})", title_justify="left")
    for column in ("scorer", "kind", "mean", "std"):
        summary.add_column(column, justify="left" if column in ("scorer", "kind") else "right")
    for j, (name, kind) in enumerate(zip(table.scorers, table.kinds)):
        summary.add_row(name, kind, f"{table.scores[:, j].mean():.4f}", f"{table.scores[:, j].std():.4f}")
    if table.meta["rewards"]:
        values = table.aggregate()
        summary.add_row("Σλ·r", "aggregate", f"{values.mean():.4f}", f"{values.std():.4f}")
    out.print(summary)
    out.print(f"wrote {out_path} and {images_dir(out_path)}/")


def _print_curve(plan, table, out_path) -> None:
    what = "base policy" if plan.target.run is None else f"{plan.target.mode} run"
    summary = Table(title=f"{plan.target.setting.name} ({what}): mean over n = {table.n} samples per point",
                    title_justify="left")
    for column in ("step", "sampler", *table.scorers):
        summary.add_column(column, justify="right")
    for (step, kind), row in zip(table.points, table.mean):
        summary.add_row(str(step), kind, *(f"{v:.4f}" for v in row))
    out.print(summary)
    out.print(f"wrote {out_path}")


def serve_judges_command(
    setting: str = typer.Option(..., "--setting", help="The setting whose [evaluate] judges are served "
                                                       "(pipelines/NAME.toml or a .toml path)."),
    command: Optional[list[str]] = typer.Argument(None, help="The command to run while the servers run, after "
                                                             "--; none: serve until interrupted."),
    vllm: str = typer.Option("vllm", "--vllm", help="The vllm executable (make judges: .side/vllm/bin/vllm)."),
    logs: Optional[Path] = typer.Option(None, "--logs", help="Folder of the servers' logs (default: "
                                                             "artifacts/SETTING/servers)."),
    share: float = typer.Option(0.3, "--share", help="GPU-memory share of each vLLM server "
                                                     "(--gpu-memory-utilization)."),
    max_model_len: int = typer.Option(8192, "--max-model-len", help="Context of each vLLM server, in tokens."),
    start_timeout: float = typer.Option(1800.0, "--start-timeout", help="Seconds a server may take to answer."),
    needs: bool = typer.Option(False, "--needs", help="Only print what must be started (one launcher a line, "
                                                      "e.g. vllm) and exit."),
) -> None:
    """Run a command while the setting's served judges (unifiedreward: a vLLM server) answer: a server on this
    host that does not answer is started, checked to serve the judge's model, and stopped afterwards."""
    from recast_cli.errors import BadInput
    from recast_cli.evaluate.servers import plan_servers, run_with_servers
    from recast_cli.setting.load import load_setting

    if not 0.0 < share <= 1.0:
        raise BadInput(f"--share must be in (0, 1], got {share:g}")
    if not 256 <= max_model_len <= 1_048_576:
        raise BadInput(f"--max-model-len must be in [256, 1048576], got {max_model_len}")
    if not start_timeout > 0:
        raise BadInput(f"--start-timeout must be > 0, got {start_timeout:g}")
    loaded = load_setting(setting)
    if needs:
        for launcher in dict.fromkeys(s.launcher for s in plan_servers(loaded) if s.state == "start"):
            out.print(launcher)
        return
    folder = logs if logs is not None else Path("artifacts") / loaded.name / "servers"
    code = run_with_servers(loaded, command or [], vllm, folder, share=share, max_model_len=max_model_len,
                            start_timeout=start_timeout)
    if code:
        raise typer.Exit(code)


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
    app.command("evaluate")(evaluate_command)
    app.command("serve-judges")(serve_judges_command)
    app.command("sample")(sample_command)

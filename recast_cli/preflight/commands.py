"""``recast check-setting`` (:mod:`recast_cli.preflight.check`: every file, model, package, server and key a
setting needs, no weight loaded) and ``recast preflight`` (:mod:`recast_cli.preflight.stage`: its policy run
at its sizes on this device), with their tables."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from recast_cli.errors import ERROR_LINE_LIMIT, cut


out = Console()


def preflight_command(
    setting: str = typer.Option(..., "--setting", help="Setting name (pipelines/NAME.toml) or a .toml path."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for preflight.json (recast.preflight/1)."),
    scale: str = typer.Option("full", "--scale", help="full: the setting's real architecture; tiny: the "
                                                      "recast tiny-model architecture of its family."),
    random_weights: bool = typer.Option(True, "--random-weights/--real-weights",
                                        help="Random weights (the only mode: nothing is downloaded or loaded)."),
    phases: str = typer.Option("build,rewards,estimate,train,evaluate", "--phases",
                               help="build: on the meta device (parameter counts, LoRA size, weight bytes, the "
                                    "reward and judge networks); rewards: each reward network scoring one batch; "
                                    "estimate, train, evaluate: one batch of each stage on random weights."),
) -> None:
    """Check a setting's policy at its real architecture on random weights, before real weights."""
    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    from recast_cli.preflight.stage import preflight

    with Progress(TextColumn("preflight {task.description}"), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task("")
        record = preflight(setting, out_dir, scale=scale, phases=phases, random_weights=random_weights,
                           progress=lambda phase: progress.update(task, description=phase))
    _print_build(record, scale)
    _print_phases(record)
    out.print(f"wrote {out_dir / 'preflight.json'}")
    failed = [(name, r["error"]) for name, r in _phase_rows(record) if "error" in r]
    if failed:
        sys.stderr.write(f"recast: error: preflight phase {failed[0][0]}: {failed[0][1]}\n")
        raise typer.Exit(1)


def _print_build(record: dict, scale: str) -> None:
    from rich.table import Table

    build = record["phases"].get("build")
    if build is None:
        return
    table = Table(title=f"preflight {record['setting']} ({scale}; configs: {build['configs']})", title_justify="left")
    for column in ("component", "class", "parameters", "buffers"):
        table.add_column(column, justify="right" if column in ("parameters", "buffers") else "left")
    for name, c in build["components"].items():
        table.add_row(name, c["class"], f"{c['parameters']:,}", f"{c.get('buffers', 0):,}")
    table.add_row("total", "", f"{build['parameters_total']:,}", f"{build.get('buffers_total', 0):,}")
    table.add_row("trainable", f"LoRA r = {build['lora_rank']} on {build['lora_layers']} layers"
                  if build["lora_rank"] else "full transformer", f"{build['trainable']:,}", "")
    out.print(table)
    offload = build["offload_text_encoders"]
    out.print(f"weights and buffers at {build['precision']}: {build['weights_bytes'] / 2**30:.2f} GiB, of which text encoders "
              f"{build['text_encoder_bytes'] / 2**30:.2f} GiB (offload_text_encoders: "
              f"{'unset, so ' if offload['setting'] is None else ''}{'on' if offload['train'] else 'off'} in training); "
              f"built in {build['seconds']:.1f} s on the meta device (nothing allocated)", highlight=False)
    if "compute" in build:
        c = build["compute"]
        out.print(f"a training step: {c['flops_per_step']:.3g} FLOP ({c['images_per_step']} images; one forward pass "
                  f"of one image {c['forward_flops']:.3g} FLOP at {c['image_tokens']} image + {c['text_tokens']} text "
                  f"tokens, × {c['cfg_passes']} with CFG, over {c['sampling_steps']} sampled and "
                  f"{c['trained_steps']} trained steps; docs/gpu.md, Compute)", highlight=False)
    _print_rewards(build["rewards"])


def _print_rewards(rewards: dict) -> None:
    """The rewards and judges: where each runs, its network's size; served ones named, not counted."""
    from rich.table import Table

    table = Table(title="rewards and judges (networks at their real architecture on the meta device, fp32)",
                  title_justify="left")
    for column in ("scorer", "role", "runs", "class", "parameters", "GiB"):
        table.add_column(column, justify="right" if column in ("parameters", "GiB") else "left")
    for name, r in rewards["scorers"].items():
        role = "+".join(r["roles"])
        if r["placement"] == "model":
            table.add_row(name, role, f"in process, {r['device']}", r["class"], f"{r['parameters']:,}",
                          f"{r['weights_bytes'] / 2**30:.2f}")
        else:
            table.add_row(name, role, r["placement"], r["note"], "-", "-")
    out.print(table)
    missed = rewards["not_counted"]
    out.print(f"reward weights on the GPU: {rewards['train_device_bytes'] / 2**30:.2f} GiB in training (its rewards), "
              f"{rewards['evaluate_device_bytes'] / 2**30:.2f} GiB in evaluation (rewards and judges); on the host: "
              f"{rewards['host_weights_bytes'] / 2**30:.2f} GiB"
              + (f"; not counted: {', '.join(missed)} (outside this process or not built)" if missed else ""),
              highlight=False)


def _phase_rows(record: dict) -> list[tuple[str, dict]]:
    phases = record["phases"]
    rows = [("materialise", phases["materialise"])] if "materialise" in phases else []
    rewards = phases.get("rewards", {})
    rows += [("rewards", rewards)] if "error" in rewards else [(f"reward {k}", v) for k, v in rewards.items()]
    rows += [("estimate", phases["estimate"])] if "estimate" in phases else []
    train = phases.get("train", {})
    rows += [("train", train)] if "error" in train else [(f"train ({k})", v) for k, v in train.items()]
    return rows + ([("evaluate", phases["evaluate"])] if "evaluate" in phases else [])


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def _print_phases(record: dict) -> None:
    """One row per phase run: the batch asked, whether it fit, the largest that did, time and memory."""
    from rich.table import Table
    from rich.text import Text

    rows = _phase_rows(record)
    if not rows:
        return
    table = Table(title=f"preflight on {record['device']} at {record['dtype']} (engine {record['engine']}): "
                        "batch asked, whether it fit, the largest that fit; text encoders offloaded; "
                        "peak GPU memory and host RSS",
                  title_justify="left")
    for column in ("phase", "batch", "fits", "fit at", "offload", "seconds", "img/s", "GPU GiB", "RSS GiB"):
        table.add_column(column, justify="left" if column in ("phase", "fits") else "right", no_wrap=column == "phase")
    for name, r in rows:
        if "error" in r:
            table.add_row(name, "", Text("error", style="red"), Text(r["error"], style="red"), "", "", "", "", "")
            continue
        fits = r.get("fits", True)
        offload = r.get("offload_text_encoders")
        table.add_row(name, str(r.get("asked", r.get("batch", ""))),
                      Text("yes" if fits else "no", style=None if fits else "red"),
                      str(r.get("largest_fit", "")) if r.get("largest_fit", "") is not None else "none",
                      "" if offload is None else ("on" if offload else "off"),
                      f"{r['seconds']:.1f}" if "seconds" in r else "-",
                      f"{r['images_per_s']:.2f}" if "images_per_s" in r else "-",
                      _gib(r.get("peak_device_bytes")), _gib(r.get("host_rss_peak_bytes")))
    out.print(table)
    if record["fits"]:
        out.print(f"fits on {record['device']} at this setting's batch sizes", highlight=False)
    else:
        would = ", ".join(f"{name} at {r['largest_fit']}" for name, r in rows if r.get("largest_fit"))
        out.print(f"does not fit on {record['device']} at this setting's batch sizes"
                  + (f"; it would at: {would}" if would else ""), highlight=False)


def check_setting_command(
    setting: str = typer.Argument(..., help="Setting name (pipelines/NAME.toml) or a .toml path."),
    all_problems: bool = typer.Option(True, "--all", hidden=True, help="List every problem (the default)."),
    first: bool = typer.Option(False, "--first", help="Stop at the first problem."),
) -> None:
    """Check a setting and every model, prompt, package, server and API key it needs (no weights are loaded);
    every problem is listed, one line each. The held-out judges are listed apart: `make judges` scores them."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from recast_cli.preflight.check import check_setting

    report = check_setting(setting, stop_at_first=first)
    table = Table(title=f"check-setting {report.file}", title_justify="left")
    for column in ("check", "subject", "result"):
        table.add_column(column, overflow="fold")
    for row in report.rows:
        table.add_row(*(Text(cell) for cell in row), style="red" if row[2] == "FAIL" else None)
    out.print(table)
    if report.judges:
        out.print(f"[yellow]held-out judges: not needed to train or by `make all SETTING={escape(report.file.stem)}`; "
                  f"`make judges SETTING={escape(report.file.stem)}` scores them once each has what it needs:[/]",
                  highlight=False)
        for line in report.judges:
            out.print(f"  {escape(line)}", soft_wrap=True, highlight=False)
    if report.problems:
        for line in report.problems:
            sys.stderr.write(f"recast: error: {cut(line, ERROR_LINE_LIMIT)}\n")
        raise typer.Exit(2)
    out.print(f"{report.file.name}: all {len(report.rows)} checks passed")


def register(app: typer.Typer) -> None:
    app.command("check-setting")(check_setting_command)
    app.command("preflight")(preflight_command)

"""A setting's whole study in FLOP and in time per GPU type: docs/gpu.md's compute table.

    python -m recast_cli.preflight.budget ocr ocr-pilot
    python -m recast_cli.preflight.budget ocr --preflight artifacts/preflight/ocr/preflight.json

Counted by :mod:`recast_cli.preflight.compute` on the setting's transformer built on the meta device
(nothing allocated); the times divide by a GPU's dense bf16 peak times an assumed utilisation. Given the
record of ``recast preflight`` (``make gpu-preflight``) of a setting at full scale on a GPU, the table
adds the measured column: its ``train`` phase timed one step of one group of G images (sampling plus
update), so a step of the setting takes that × images a step ÷ G, and the study that × its steps; the
rate this implies is shown as FLOP/s and as the share of the GPU's peak (docs/gpu.md, "Compute").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recast_cli.preflight.compute import step_compute


#: Dense bf16 peaks (FLOP/s) of the GPUs docs/gpu.md tabulates, from their data sheets (SXM parts).
PEAK_BF16 = {"A100": 312e12, "H100": 989.4e12, "H200": 989.4e12}
#: The share of the peak a step is assumed to reach until `make gpu-preflight` measures it.
ASSUMED_UTILISATION = 0.4


def study_compute(name: str) -> dict[str, Any]:
    """The training and evaluation FLOP of a setting's whole study (``[study]``: warmup, then every budget ×
    mode × seed run), counted on its transformer's configs on the meta device."""
    from recast_cli.preflight.stage import meta_transformer
    from recast_cli.setting.load import load_setting
    from recast_cli.study.spec import load_study
    from recast_cli.evaluate.config import config_from_setting as evaluate_config
    from recast_cli.setting.prompts import load_prompts
    from recast_cli.train.config import config_from_setting, trained_steps

    setting = load_setting(name)
    cfg = config_from_setting(setting)
    transformer = meta_transformer(setting)
    step = step_compute(transformer, setting.policy, cfg, len(trained_steps(setting.policy.steps, cfg.train_fraction)))
    study = load_study(setting)
    runs = len(study.budgets) * len(study.modes) * len(study.seeds)
    steps = study.warmup_steps + runs * cfg.max_steps
    evaluation, _ = evaluate_config(setting)
    per_eval = None  # the held-out prompts counted where they are (fetched)
    if Path(evaluation.prompts).is_file():
        prompts = len(load_prompts(evaluation.prompts)[0])
        eval_steps = evaluation.steps if evaluation.steps is not None else setting.policy.steps
        per_eval = prompts * evaluation.n * eval_steps * step["cfg_passes"] * step["forward_flops"]
    return {"setting": setting.name, "step": step, "runs": runs, "steps": steps,
            "train_flops": steps * step["flops_per_step"], "evaluations": runs + 1, "eval_flops": per_eval}


def measured_step(record: dict[str, Any], name: str) -> dict[str, Any]:
    """What a ``recast preflight`` record (``recast.preflight/1``) measured of one training step of setting
    ``name``: the train phase's compiled step where it ran and fit, else the eager one; BadInput for a record
    of another setting, one not at full scale on a GPU, or one without a train step that fit."""
    from recast_cli.errors import BadInput
    from recast_cli.setting.load import load_setting

    setting = load_setting(name)
    if record.get("schema") != "recast.preflight/1":
        raise BadInput(f"--preflight: not a recast.preflight/1 record (schema {record.get('schema')!r})")
    recorded = str(record.get("setting", ""))
    if Path(recorded).name != setting.file.name:
        raise BadInput(f"--preflight: the record is of {recorded or 'no setting'}, not {setting.file}")
    if record.get("scale") != "full" or not str(record.get("device", "")).startswith("cuda"):
        raise BadInput(f"--preflight: the record ran at scale {record.get('scale')!r} on {record.get('device')!r}; "
                       "a step's time is measured at full scale on a GPU (make gpu-preflight)")
    train = (record.get("phases") or {}).get("train") or {}
    for key in ("compile", "eager"):
        run = train.get(key) or {}
        if run.get("fits", True) and "error" not in run and "sample_seconds" in run and run.get("images"):
            seconds = float(run["sample_seconds"]) + float(run["update_seconds"])
            return {"device": str(record["device"]), "run": key, "images": int(run["images"]),
                    "seconds_per_image": seconds / int(run["images"])}
    raise BadInput("--preflight: its train phase has no step that ran and fit (phases.train.compile / eager)")


def table(names: list[str], measured: dict[str, Any] | None = None) -> str:
    """docs/gpu.md's compute table (markdown) for the settings ``names``; with ``measured``
    (:func:`measured_step` of the first setting), a column of the times on the GPU that measured it."""
    extra = [f"measured on {measured['device']} ({measured['run']}): a step / the study's training / "
             "FLOP/s (share of peak)"] if measured else []
    rows = ["| setting | images a step | FLOP a step | steps (warmup + runs × steps) | training FLOP | "
            + " | ".join([f"{gpu}: a step / the study's training" for gpu in PEAK_BF16] + extra) + " |",
            "|---|---:|---:|---|---:|" + "---:|" * (len(PEAK_BF16) + len(extra))]
    for i, name in enumerate(names):
        c = study_compute(name)
        times = []
        for peak in PEAK_BF16.values():
            rate = peak * ASSUMED_UTILISATION
            times.append(f"{_duration(c['step']['flops_per_step'] / rate)} / {_duration(c['train_flops'] / rate)}")
        if measured:
            times.append(_measured_cell(c, measured) if i == 0 else "—")
        rows.append(f"| `{c['setting']}` | {c['step']['images_per_step']} | {c['step']['flops_per_step']:.3g} | "
                    f"{c['steps']:,} ({c['runs']} runs) | {c['train_flops']:.3g} | " + " | ".join(times) + " |")
    return "\n".join(rows)


def _measured_cell(c: dict[str, Any], measured: dict[str, Any]) -> str:
    step = c["step"]
    per_step = measured["seconds_per_image"] * step["images_per_step"]
    rate = step["flops_per_step"] / per_step
    peak = next((p for gpu, p in PEAK_BF16.items() if gpu in measured["device"]), None)
    share = f" ({rate / peak:.0%})" if peak else ""
    return f"{_duration(per_step)} / {_duration(per_step * c['steps'])} / {rate:.3g}{share}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    from recast_cli.errors import BadInput

    parser = argparse.ArgumentParser(prog="python -m recast_cli.preflight.budget",
                                     description="docs/gpu.md's compute table of settings' studies.")
    parser.add_argument("settings", nargs="*", default=["ocr", "ocr-pilot"])
    parser.add_argument("--preflight", type=Path, help="a recast preflight record (preflight.json) of the first "
                                                       "setting at full scale on a GPU: adds its measured times")
    args = parser.parse_args(argv)
    try:
        measured = None
        if args.preflight is not None:
            try:
                record = json.loads(args.preflight.read_text())
            except (OSError, ValueError) as exc:
                raise BadInput(f"--preflight {args.preflight}: not a readable JSON file ({type(exc).__name__})")
            measured = measured_step(record if isinstance(record, dict) else {}, args.settings[0])
        print(table(args.settings, measured))
    except BadInput as exc:
        print(f"recast: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

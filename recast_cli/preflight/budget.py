"""A setting's whole study in FLOP and in time per GPU type: docs/gpu.md's compute table.

    python -m recast_cli.preflight.budget ocr ocr-pilot

Counted by :mod:`recast_cli.preflight.compute` on the setting's transformer built on the meta device
(nothing allocated); the times divide by a GPU's dense bf16 peak times an assumed utilisation until
`make gpu-preflight` has measured the real rate (docs/gpu.md, "Compute").
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


def table(names: list[str]) -> str:
    """docs/gpu.md's compute table (markdown) for the settings ``names``."""
    rows = ["| setting | images a step | FLOP a step | steps (warmup + runs × steps) | training FLOP | "
            + " | ".join(f"{gpu}: a step / the study's training" for gpu in PEAK_BF16) + " |",
            "|---|---:|---:|---|---:|" + "---:|" * len(PEAK_BF16)]
    for name in names:
        c = study_compute(name)
        times = []
        for peak in PEAK_BF16.values():
            rate = peak * ASSUMED_UTILISATION
            times.append(f"{_duration(c['step']['flops_per_step'] / rate)} / {_duration(c['train_flops'] / rate)}")
        rows.append(f"| `{c['setting']}` | {c['step']['images_per_step']} | {c['step']['flops_per_step']:.3g} | "
                    f"{c['steps']:,} ({c['runs']} runs) | {c['train_flops']:.3g} | " + " | ".join(times) + " |")
    return "\n".join(rows)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


if __name__ == "__main__":
    import sys

    print(table(sys.argv[1:] or ["ocr", "ocr-pilot"]))

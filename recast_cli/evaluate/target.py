"""What ``recast evaluate`` evaluates, resolved once: a setting's base model, or a ``recast train`` run's
checkpoint (the latest, or ``--checkpoint STEP``) under the run's own setting. Both the image
evaluation (``evaluate/stage``) and the 1-D world's curves (``evaluate/curve``) start from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recast_cli.artifacts import RunRecord
from recast_cli.artifacts.run import run_checkpoint
from recast_cli.errors import BadInput


@dataclass(frozen=True)
class Target:
    """What is evaluated: a setting's base model, or a run's checkpoint under the run's setting."""

    setting: Any  # recast_cli.setting.load.Setting
    mode: str  # "base" or the run's W mode
    run: Path | None = None
    run_record: RunRecord | None = None  # the run's run.json
    checkpoint: Path | None = None
    step: int | None = None


def resolve_target(run: Path | None, setting: str | None, checkpoint: int | None) -> Target:
    """The base model of ``--setting``, or ``--run``'s checkpoint (latest, or step ``checkpoint``),
    verified, under the setting the run trained (``artifacts.run.run_checkpoint``)."""
    from recast_cli.setting.load import load_setting

    if (run is None) == (setting is None):
        raise BadInput("give exactly one of --run RUN_DIR (a trained run) and --setting S (the base model)")
    if run is None:
        if checkpoint is not None:
            raise BadInput("--checkpoint selects a checkpoint of --run; the base model has none")
        return Target(setting=load_setting(setting), mode="base")
    found = run_checkpoint(run, f"--run {run}", step=checkpoint)
    return Target(setting=load_setting(found.record.setting), mode=found.record.mode, run=run,
                  run_record=found.record, checkpoint=found.folder, step=found.step)

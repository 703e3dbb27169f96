"""What ``recast evaluate`` evaluates, resolved once: a setting's base model, or a ``recast train`` run's
checkpoint (the latest, or ``--checkpoint STEP``) under the run's own setting, refused when that setting's
[policy] or [world] changed since the run trained (``--allow-setting-change`` accepts it, recorded in the
output). Both the image evaluation (``evaluate/stage``) and the 1-D world's curves (``evaluate/curve``)
start from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recast_cli.artifacts import RunRecord
from recast_cli.artifacts.run import ALLOW_SETTING_CHANGE, refuse_setting_change, run_checkpoint
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
    setting_changes: tuple[str, ...] = ()  # what of the run's setting changed since it trained, accepted


def resolve_target(run: Path | None, setting: str | None, checkpoint: int | None,
                   allow_setting_change: bool = False) -> Target:
    """The base model of ``--setting``, or ``--run``'s checkpoint (latest, or step ``checkpoint``),
    verified, under the setting the run trained (``artifacts.run.run_checkpoint``), unchanged since
    unless ``allow_setting_change`` (``artifacts.run.refuse_setting_change``)."""
    from recast_cli.setting.load import load_setting, policy_inputs, policy_values

    if (run is None) == (setting is None):
        raise BadInput("give exactly one of --run RUN_DIR (a trained run) and --setting S (the base model)")
    if run is None:
        if checkpoint is not None:
            raise BadInput("--checkpoint selects a checkpoint of --run; the base model has none")
        if allow_setting_change:
            raise BadInput(f"{ALLOW_SETTING_CHANGE} applies to --run (a run's setting edited since it trained)")
        return Target(setting=load_setting(setting), mode="base")
    found = run_checkpoint(run, f"--run {run}", step=checkpoint)
    loaded = load_setting(found.record.setting)
    changes = refuse_setting_change(found.record.config, policy_inputs(loaded), policy_values(loaded),
                                    where=f"--run {run}", setting=loaded.file, since="the run trained",
                                    allow=allow_setting_change)
    return Target(setting=loaded, mode=found.record.mode, run=run, run_record=found.record, checkpoint=found.folder,
                  step=found.step, setting_changes=tuple(changes))

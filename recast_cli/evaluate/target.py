"""What ``recast evaluate`` evaluates, resolved once: a setting's base model, or a ``recast train`` run's
checkpoint (the latest, or ``--checkpoint STEP``) under the run's own setting. Both the image
evaluation (``evaluate/stage``) and the 1-D world's curves (``evaluate/curve``) start from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recast_cli.artifacts import RunRecord, RunRecordError, read_run
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
    """The base model of ``--setting``, or ``--run``'s checkpoint (latest, or step ``checkpoint``)."""
    from recast_cli.setting.load import load_setting
    from recast_cli.train.checkpoint import list_checkpoints, read_checkpoint, step_dir

    if (run is None) == (setting is None):
        raise BadInput("give exactly one of --run RUN_DIR (a trained run) and --setting S (the base model)")
    if run is None:
        if checkpoint is not None:
            raise BadInput("--checkpoint selects a checkpoint of --run; the base model has none")
        return Target(setting=load_setting(setting), mode="base")
    try:
        record = read_run(run)
    except RunRecordError as exc:
        if exc.problem == "missing":
            raise BadInput(f"--run {run}: not a recast train run folder (no run.json)") from None
        if exc.problem in ("json", "object", "config", "setting", "mode"):
            raise BadInput(f"{exc.path} is not a recast.run/1 record (no config.setting or mode)") from None
        raise
    if not Path(record.setting).is_file():
        raise BadInput(f"--run {run}: the run's setting {record.setting} (from {run / 'run.json'}) is not there")
    found = dict(list_checkpoints(run))
    if not found:
        raise BadInput(f"--run {run}: the run has no complete checkpoint yet")
    if checkpoint is None:
        checkpoint = max(found)
    elif checkpoint not in found:
        raise BadInput(f"--run {run}: no checkpoint of step {checkpoint} "
                       f"(it has {', '.join(str(s) for s in sorted(found))})")
    folder = step_dir(run, checkpoint)
    read_checkpoint(folder)  # verifies every file against the manifest: a corrupt checkpoint is named here
    return Target(setting=load_setting(record.setting), mode=record.mode, run=run, run_record=record,
                  checkpoint=folder, step=checkpoint)

"""``recast.run/1``: the record of a ``recast train`` run folder and the listing of its checkpoints, torch-free.

``RUN/run.json`` is written once, when the run starts: the provenance keys (``config`` the
trainer's resolved configuration, ``sources`` the setting and the W file), ``rewards``,
``lambda``, ``mode`` (the W's) and ``sigmas`` (W's grid, σ_T … σ_0). ``RUN/checkpoints/step-NNNNNN/``
are its checkpoints (``recast.checkpoint/1``), complete once their ``manifest.json`` is in place;
saving and loading one needs torch (train/checkpoint.py), listing and verifying them does not.

A run or checkpoint folder named on the command line (``recast evaluate --run``, ``recast estimate
--policy``, ``recast train --init``, a LoRA to apply) is resolved here, once: which checkpoint
(:func:`run_checkpoint`, :func:`find_checkpoint`), verified against its manifest
(:func:`verify_checkpoint`), with the run's record and the setting it names (:func:`run_record`).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from recast_cli.artifacts.cells import MADE_FROM
from recast_cli.artifacts.io import PROVENANCE_KEYS, Provenance, Source, atomic_write_bytes, sha256_file
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.artifacts.weights import MODES
from recast_cli.errors import BadInput, cut

RUN_SCHEMA = "recast.run/1"
CHECKPOINT_SCHEMA = "recast.checkpoint/1"
RECORD_NAME = "run.json"
MANIFEST_NAME = "manifest.json"
#: a run's checkpoints, ``RUN/checkpoints/step-NNNNNN/``
CHECKPOINTS = "checkpoints"
#: a checkpoint's ``adapter/`` holds the LoRA in diffusers' file name, or the full network's weights
LORA_FILE = "pytorch_lora_weights.safetensors"
FULL_FILE = "diffusion_pytorch_model.safetensors"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
#: beside ``made_from`` (label → digest of the [policy] and [world] a run trained), what each digest is of
#: (``setting.load.policy_values``): a setting edited since is refused naming the key that changed
MADE_FROM_VALUES = "made_from_values"
#: the one flag of ``evaluate --run``, ``sample --run`` and ``evaluate --add-judges`` that uses a setting
#: edited since the run trained (or the images were made) all the same; what changed is recorded in the output
ALLOW_SETTING_CHANGE = "--allow-setting-change"
#: the key of an output's provenance config listing what of the setting changed and was accepted
SETTING_CHANGES = "setting_changes"
#: how many changed keys a refusal names (the rest are counted)
_NAMED_CHANGES = 4
#: the characters a changed value is shown in
_VALUE_CHARS = 60


@dataclass(frozen=True)
class RunRecord:
    """What a run trains, as its ``run.json`` records it.

    ``rewards`` and ``lam`` are the run's rewards and budgets λ (as the setting gave them), ``mode``
    the mode of its W and ``sigmas`` the grid W was checked against, σ_T … σ_0. ``config`` (of a
    record read back) is the trainer's configuration record: ``setting`` (the setting file),
    ``weights``, ``weights_key``, ``run_key``, ``train`` (the resolved [train] table), ``T``,
    ``trained_steps``, ``init``, ``processes``, ``engine``.
    """

    rewards: tuple[str, ...]
    lam: tuple[float, ...]
    mode: str
    sigmas: tuple[float, ...]
    provenance: Provenance | None = None

    @property
    def config(self) -> dict[str, Any]:
        return self.provenance.config if self.provenance is not None else {}

    @property
    def setting(self) -> str:
        """The setting file the run trains with (``config.setting``)."""
        return self.config["setting"]


class RunRecordError(BadInput):
    """A folder ``read_run`` refuses. ``problem`` names the first check that failed, so that a command
    can word it for its own flag: ``missing`` (no run.json file), ``json`` (unreadable, not JSON),
    ``object`` (JSON, but not an object), ``schema`` (another tag: ``tag``), ``config`` (no config
    object), ``setting`` (no config.setting), ``mode`` (no mode) or ``fields`` (anything else)."""

    def __init__(self, message: str, path: Path, problem: str, tag: Any = None):
        super().__init__(message)
        self.path = path
        self.problem = problem
        self.tag = tag


def read_run(folder: str | os.PathLike[str]) -> RunRecord:
    """Read and validate ``folder/run.json``; a :class:`RunRecordError` (BadInput) names what is wrong."""
    folder = Path(folder)
    path = folder / RECORD_NAME
    if not path.is_file():
        raise RunRecordError(f"{folder}: not a recast train run folder (no {RECORD_NAME})", path, "missing")
    try:
        raw = json_loads(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise RunRecordError(f"{path}: not a JSON file", path, "json") from None
    return _parse_record(raw, path)


def write_run(folder: str | os.PathLike[str], record: RunRecord, *, config: Mapping[str, Any] | None = None,
              sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Write ``folder/run.json`` atomically; a record that ``read_run`` would refuse is refused first."""
    path = Path(folder) / RECORD_NAME
    provenance = Provenance.new(RUN_SCHEMA, config, sources)
    data = {**provenance.to_metadata(), "rewards": list(record.rewards), "lambda": list(record.lam),
            "mode": record.mode, "sigmas": list(record.sigmas)}
    text = json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
    _parse_record(json.loads(text), path)
    atomic_write_bytes(path, text.encode())
    return provenance


def _parse_record(raw: Any, path: Path) -> RunRecord:
    tag = raw.get("schema") if isinstance(raw, dict) else None

    def refuse(message: str, problem: str = "fields") -> NoReturn:
        raise RunRecordError(f"{path}: {message}", path, problem, tag)

    if tag != RUN_SCHEMA:
        refuse(f"schema tag is {tag!r}, expected {RUN_SCHEMA!r}", "schema" if isinstance(raw, dict) else "object")
    if not isinstance(raw.get("config"), dict):
        refuse("'config' must be a JSON object", "config")
    if not isinstance(raw["config"].get("setting"), str):
        refuse("the record names no setting (config.setting)", "setting")
    if "mode" not in raw:
        refuse("the record has no 'mode'", "mode")
    if raw["mode"] not in MODES:
        refuse(f"mode {raw['mode']!r} is not one of {', '.join(MODES)}")
    missing = [k for k in (*PROVENANCE_KEYS[1:], "rewards", "lambda", "sigmas") if k not in raw]
    if missing:
        refuse(f"the record is missing {', '.join(map(repr, missing))}")
    if not (isinstance(raw["rewards"], list) and all(isinstance(r, str) for r in raw["rewards"])):
        refuse("'rewards' must be a list of reward names")
    for key in ("lambda", "sigmas"):
        if not (isinstance(raw[key], list) and all(_finite_number(x) for x in raw[key])):
            refuse(f"{key!r} must be a list of finite numbers")
    try:
        provenance = Provenance.from_metadata(raw, str(path))
    except BadInput as exc:
        raise RunRecordError(str(exc), path, "fields", tag) from None
    return RunRecord(rewards=tuple(raw["rewards"]), lam=tuple(raw["lambda"]), mode=raw["mode"],
                     sigmas=tuple(raw["sigmas"]), provenance=provenance)


def _finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --------------------------------------------------------------------------- checkpoints


def step_dir(run: Path, step: int) -> Path:
    return run / CHECKPOINTS / f"step-{step:06d}"


def list_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (a manifest present), oldest first."""
    root = run / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / MANIFEST_NAME).is_file():
            found.append((int(match[1]), child))
    return sorted(found)


def latest_checkpoint(run: Path) -> Path | None:
    found = list_checkpoints(run)
    return found[-1][1] if found else None


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """Check a checkpoint folder against its manifest and return the manifest: the schema, every listed
    file present with its sha256, the state files listed. Torch-free (loading is ``train/checkpoint``'s).

    BadInput names the problem: not a checkpoint, another schema, a file missing or changed.
    """
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        raise BadInput(f"{folder} is not a recast checkpoint (no {MANIFEST_NAME})")
    try:
        manifest = json_loads(manifest_path.read_text(), str(manifest_path))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{manifest_path} is corrupt (not JSON)") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != CHECKPOINT_SCHEMA:
        raise BadInput(f"{folder}: schema {manifest.get('schema') if isinstance(manifest, dict) else None!r}, "
                       f"expected {CHECKPOINT_SCHEMA}")
    for rel, digest in sorted(manifest.get("files", {}).items()):
        path = folder / rel
        if not path.is_file():
            raise BadInput(f"checkpoint {folder} is corrupt: {rel} is missing")
        if sha256_file(path) != digest:
            raise BadInput(f"checkpoint {folder} is corrupt: {rel} does not match its sha256 in {MANIFEST_NAME}")
    for required in ("state.safetensors", "state.json"):
        if required not in manifest.get("files", {}):
            raise BadInput(f"checkpoint {folder} is corrupt: the manifest lists no {required}")
    return manifest


# --------------------------------------------------------------------------- a run or checkpoint a flag names


@dataclass(frozen=True)
class RunCheckpoint:
    """A checkpoint as a command was given it: its folder and step, and the run it belongs to.

    ``step`` is None for a checkpoint folder named directly under another name than ``step-N``;
    ``record`` (the run's ``run.json``) is None where it was not asked for (a LoRA to apply,
    ``--init``: the weights alone matter there), and so is ``run`` for a checkpoint folder named so.
    """

    folder: Path
    step: int | None
    run: Path | None = None
    record: RunRecord | None = None


def run_record(run: Path, where: str) -> RunRecord:
    """The record of the run folder ``run`` (``read_run``), whose setting file must be there: a run is
    measured under the setting it trained. BadInput worded for ``where`` (the flag and its value)."""
    try:
        record = read_run(run)
    except RunRecordError as exc:
        if exc.problem == "missing":
            raise BadInput(f"{where}: not a recast train run folder (no {RECORD_NAME})") from None
        raise
    problem = file_problem(record.setting)
    if problem:
        raise BadInput(f"{where}: the run's setting {record.setting} (from {run / RECORD_NAME}) {problem}")
    return record


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a regular file (``is not there``, ``is not a regular file``: a FIFO,
    a folder, a device), or None. Only stat'ed: a FIFO there never blocks."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "is not there"
    except (OSError, ValueError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    return None if stat.S_ISREG(info.st_mode) else "is not a regular file"


# --------------------------------------------------------------------------- a setting edited since


def setting_changes(recorded: Mapping[str, Any], now: Mapping[str, str],
                    now_values: Mapping[str, Any]) -> list[str] | None:
    """What of a setting's [policy] and [world] differs from what an output recorded when it was made.

    ``recorded`` holds ``made_from`` (label → digest) and ``made_from_values`` (what each digest is of):
    a run's ``run.json`` config, an evaluation's metadata. ``now`` and ``now_values``: the same of the
    setting as it is (``setting.load.policy_inputs`` and ``policy_values``). One line a changed key,
    ``[policy] resolution 32 -> 48``; the label alone where only its digest was recorded. Labels the
    setting does not digest (a run's ``[train] prompts``: what it trained on, not what it samples) are
    not compared. None where nothing was recorded (an older recast's output)."""
    made, values = recorded.get(MADE_FROM), recorded.get(MADE_FROM_VALUES)
    if not isinstance(made, dict):
        return None
    values = values if isinstance(values, dict) else {}
    changes: list[str] = []
    for label, digest in now.items():
        if made.get(label) == digest:
            continue
        old, new = values.get(label, _MISSING), now_values.get(label)
        if isinstance(old, dict) and isinstance(new, dict):
            keys = [k for k in sorted({*old, *new}) if old.get(k, _MISSING) != new.get(k, _MISSING)]
            changes.extend(f"{label} {cut(json.dumps(k)[1:-1], _VALUE_CHARS)} {_value(old.get(k, _MISSING))} -> "
                           f"{_value(new.get(k, _MISSING))}" for k in keys)
            if keys:
                continue
        elif old is not _MISSING and old != new:
            changes.append(f"{label} {_value(old)} -> {_value(new)}")
            continue
        changes.append(f"{label} (not recorded)" if label not in made else
                       f"{label} (only its digest was recorded)" if old is _MISSING else
                       f"{label} (its digest differs from the record)")
    return changes


def refuse_setting_change(recorded: Mapping[str, Any], now: Mapping[str, str], now_values: Mapping[str, Any], *,
                          where: str, setting: str | os.PathLike[str], since: str, allow: bool) -> list[str]:
    """BadInput, one line naming ``setting``, ``since`` when (``the run trained``) and the keys that changed
    (:func:`setting_changes`), unless nothing did or ``allow`` (:data:`ALLOW_SETTING_CHANGE`) accepts it.
    Returns what was accepted, for the caller to record in its output (empty when nothing changed)."""
    changes = setting_changes(recorded, now, now_values)
    if changes is None:
        changes = [f"{', '.join(now)} not recorded (made by an older recast)"]
        if not allow:
            raise BadInput(f"{where}: made by an older recast, which did not record the {' and '.join(now)} it was "
                           f"made with; pass {ALLOW_SETTING_CHANGE} to use {setting} as it is")
    if changes and not allow:
        named = changes[:_NAMED_CHANGES] + ([f"{len(changes) - _NAMED_CHANGES} more"]
                                            if len(changes) > _NAMED_CHANGES else [])
        raise BadInput(f"{where}: {setting} changed since {since}: {'; '.join(named)}; pass {ALLOW_SETTING_CHANGE} "
                       "to use it as it is")
    return changes


_MISSING = object()


def _value(value: Any) -> str:
    """A recorded value in a change line: JSON (control characters escaped), cut; ``unset`` for none."""
    if value is _MISSING or value is None:
        return "unset"
    return cut(json.dumps(value, sort_keys=True), _VALUE_CHARS)


def run_checkpoint(run: Path, where: str, *, step: int | None = None, record: bool = True,
                   verify: bool = True) -> RunCheckpoint:
    """The complete checkpoint of step ``step`` (the latest when None) of the run folder ``run``.

    With ``record`` the run's ``run.json`` is read first (:func:`run_record`); with ``verify`` the
    checkpoint is checked against its manifest (:func:`verify_checkpoint`): a corrupt or partial
    checkpoint is named before any work. BadInput worded for ``where`` (the flag and its value).
    """
    recorded = run_record(run, where) if record else None
    found = dict(list_checkpoints(run))
    if not found:
        raise BadInput(f"{where}: the run has no complete checkpoint yet")
    if step is None:
        step = max(found)
    elif step not in found:
        raise BadInput(f"{where}: no checkpoint of step {step} (it has {', '.join(str(s) for s in sorted(found))})")
    if verify:
        verify_checkpoint(found[step])
    return RunCheckpoint(found[step], step, run, recorded)


def is_run_folder(folder: Path) -> bool:
    """A ``recast train`` run folder: its ``run.json`` or its ``checkpoints/`` is there."""
    return (folder / RECORD_NAME).is_file() or (folder / CHECKPOINTS).is_dir()


def find_checkpoint(path: str | os.PathLike[str], where: str, *, record: bool = True,
                    verify: bool = True) -> RunCheckpoint | None:
    """The checkpoint a folder names: a run folder's latest complete checkpoint (:func:`run_checkpoint`),
    or a checkpoint folder itself (its ``manifest.json``; with ``record``, one inside its run,
    ``RUN/checkpoints/step-N``, whose record is read). None for any other path: the caller says what
    else it takes. ``record`` and ``verify`` as for :func:`run_checkpoint`.
    """
    folder = Path(path)
    if is_run_folder(folder):
        return run_checkpoint(folder, where, record=record, verify=verify)
    run = folder.parent.parent
    if not (folder / MANIFEST_NAME).is_file() or (record and not (run / RECORD_NAME).is_file()):
        return None
    recorded = run_record(run, where) if record else None
    if verify:
        verify_checkpoint(folder)
    match = _STEP_DIR.match(folder.name)
    return RunCheckpoint(folder, int(match[1]) if match else None, run if record else None, recorded)

"""Planning a ``recast train`` run: every check before the first byte is written (docs/method.md §6).

:func:`plan_run` checks the loaded setting and its ``[train]`` table, the prompts, the sampler's σ
grid, the steps the trainer trains and its noise level, and W (the static matrix, or a ``solve-w``
file checked against the run), and decides whether ``--out`` starts, restarts or resumes a run.
Nothing here loads a model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts import (
    RUN_SCHEMA, RunRecord, RunRecordError, WeightMatrix, claim_folder, lambda_hat, read_run, read_weights,
)
from recast_cli.artifacts.cells import MADE_FROM
from recast_cli.artifacts.run import find_checkpoint
from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.families import FAMILIES
from recast_cli.setting.prompts import load_prompts
from recast_cli.setting.load import Setting, analytic_world, digest, policy_inputs, policy_values
from recast_cli.solve.stage import static_matrix
from recast_cli.train import checkpoint as ckpt
from recast_cli.train.config import TrainConfig, check_config, skip_clean_of, trained_steps

#: Policy kinds ``recast train`` can update.
#: the trainable policies beside the image families (recast_cli/policy/families.py)
TRAINABLE_ANALYTIC = ("flow1d",)


def static_run_weights(cfg: TrainConfig, sigmas_desc: np.ndarray) -> WeightMatrix:
    """``--weights static``: the static W of the run's rewards and λ on the sampler's grid, W = λ̂_i / T'
    on the trained steps (solve's one static builder, :func:`~recast_cli.solve.stage.static_matrix`)."""
    T = len(sigmas_desc) - 1
    return static_matrix(cfg.rewards, cfg.lam, sigmas_desc, skip_clean_of(T, cfg.train_fraction),
                         info={"built_by": "recast train --weights static"})


def run_noise_level(cfg: TrainConfig, spec) -> float:
    """The SDE noise level a the run samples and trains with: ``[train] noise_level``, else the policy's."""
    level = float(cfg.noise_level if cfg.noise_level is not None else spec.noise_level)
    if level <= 0:
        raise BadInput("the trainer needs the SDE sampler: noise_level must be > 0")
    return level


def check_weights(w: WeightMatrix, cfg: TrainConfig, sigmas_desc: np.ndarray, grid: GridSpec | None, where: str,
                  steps: list[int]) -> None:
    """BadInput unless W is for the setting's rewards (same order), λ, the sampler's grid and
    the ``steps`` the trainer trains (E13 spends W only there): W's own trained steps (its
    ``trained_steps`` metadata; a file from before it: every step) must be exactly these."""
    if tuple(w.rewards) != tuple(cfg.rewards):
        raise BadInput(f"{where} is for rewards ({', '.join(w.rewards)}), the setting trains "
                       f"({', '.join(cfg.rewards)}) in that order")
    T = len(sigmas_desc) - 1
    skip = skip_clean_of(T, cfg.train_fraction)
    hint = f"`recast solve-w --steps {T}{grid.flags() if grid else ''}" + (f" --skip-clean {skip}`" if skip else "`")
    if w.T != T:
        raise BadInput(f"{where} has T = {w.T} steps, the sampler uses T = {T}; resample it with {hint}")
    if np.max(np.abs(np.asarray(w.sigmas) - sigmas_desc)) > 1e-6:
        raise BadInput(f"{where} is on another σ grid than the sampler's (same T = {T}); resample it with {hint}")
    a, b = lambda_hat(np.asarray(w.lam)), lambda_hat(np.asarray(cfg.lam))
    if np.max(np.abs(a - b)) > 1e-9:
        raise BadInput(f"{where} was solved for lambda {list(w.lam)}, the run uses {list(cfg.lam)} "
                       "(pass --lambda or solve W again)")
    trained, weighted = set(steps), set(w.steps)
    if weighted - trained:
        raise BadInput(f"{where} puts weight on step(s) {sorted(weighted - trained)}, which the trainer does not "
                       f"train (it trains t = {min(trained)}…{max(trained)}); solve it with --skip-clean {skip}")
    if trained - weighted:
        raise BadInput(f"{where} gives trained step(s) {sorted(trained - weighted)} a zero column; "
                       f"solve it with --skip-clean {skip}")


@dataclass
class Plan:
    """Everything resolved and checked before the first byte is written."""

    setting: Setting
    cfg: TrainConfig
    weights: WeightMatrix
    weights_source: str  # a path, or "static"
    prompts: list[str]
    run: Path
    resume_from: Path | None
    init_from: Path | None
    device: str | None
    trained_steps: list[int]  # the steps t the loss covers, noisiest first (``train.config.trained_steps``)
    noise_level: float  # the SDE's a, sampling and training (``run_noise_level``)
    made_from: dict[str, str] = field(default_factory=dict)  # the policy and world it trains (``run_inputs``)
    made_from_values: dict[str, Any] = field(default_factory=dict)  # what those digest (``policy_values``)


def plan_run(setting: Setting, cfg: TrainConfig, weights: str, out: Path, resume: bool, init: str | None,
             device: str | None, sigmas_desc: np.ndarray | None = None, grid: GridSpec | None = None) -> Plan:
    """Resolve and check a run of the loaded ``setting``; raises BadInput for anything the user can fix
    (nothing is written)."""
    from recast_cli.setting.load import check_prompts

    if setting.policy.kind not in FAMILIES and setting.policy.kind not in TRAINABLE_ANALYTIC:
        raise BadInput(f"setting {setting.name!r}: recast train needs a trainable policy "
                       f"({', '.join((*FAMILIES, *TRAINABLE_ANALYTIC))}), "
                       f"not {setting.policy.kind!r}")
    if setting.policy.kind == "flow1d" and cfg.lora_rank != 0:
        raise BadInput(f"setting {setting.name!r}: a flow1d policy trains its residual MLP in full; "
                       f"set [train] lora_rank = 0 (got {cfg.lora_rank})")
    check_config(cfg)
    if setting.policy.kind == "flow1d":  # its rewards are its world's ([world], or docs/method.md §4's)
        for name in cfg.rewards:
            analytic_world(setting.policy).check_reward(name)
    prompts, _ = load_prompts(cfg.prompts)
    check_prompts(setting.policy, prompts)
    if sigmas_desc is None:
        sigmas_desc, grid = scheduler_grid(setting.policy)
    steps = trained_steps(len(sigmas_desc) - 1, cfg.train_fraction)
    if weights == "static":
        w = static_run_weights(cfg, sigmas_desc)
    else:
        w = read_weights(weights)
        check_weights(w, cfg, sigmas_desc, grid, weights, steps)
    resume_from, made_from = None, run_inputs(setting, prompts)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, not a run folder")
    if out.is_dir() and (out / "run.json").exists():
        record = read_run_record(out)
        if not resume:
            raise BadInput(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
        found = ckpt.list_checkpoints(out)
        if found:
            resume_from = found[-1][1]
            _, state = ckpt.read_checkpoint(resume_from)
            check_same_run(state, cfg, w, weights, resume_from)
            check_same_inputs(state.get(MADE_FROM), made_from, f"checkpoint {resume_from}", setting)
        elif record.config.get("weights_key") != weights_key(w) or \
                record.config.get("run_key", cfg.run_key()) != cfg.run_key():
            raise BadInput(f"--resume: {out} holds the start of another run (another W or configuration) and no "
                           "checkpoint; choose another --out")
        else:
            check_same_inputs(record.config.get(MADE_FROM), made_from, f"the start of the run in {out}", setting)
    elif out.is_dir():
        if resume:
            raise BadInput(f"--resume: {out} holds no recast run (no run.json); drop --resume to start one in a new "
                           "or empty folder")
        if any(out.iterdir()):
            raise BadInput(f"--out {out} is not empty and holds no recast run; choose a new or empty folder")
    init_from = None if init is None else init_adapter(init)
    claim_folder(out, RUN_SCHEMA)  # not inside another artifact folder
    return Plan(setting, cfg, w, weights, prompts, out, resume_from, init_from, device, steps,
                run_noise_level(cfg, setting.policy), made_from, policy_values(setting))


def init_adapter(init: str) -> Path:
    """``--init``: the adapter folder a run starts from — a run's latest complete checkpoint, a checkpoint
    folder (either verified: ``artifacts.run.find_checkpoint``), or an adapter folder or file."""
    from recast_cli.policy.lora import resolve_adapter

    if not Path(init).exists():
        raise BadInput(f"--init {init}: no such checkpoint")
    found = find_checkpoint(init, f"--init {init}", record=False)
    return found.folder / "adapter" if found is not None else resolve_adapter(Path(init)).parent


def scheduler_grid(spec) -> tuple[np.ndarray, GridSpec]:
    """σ_T … σ_0 of the setting's sampler and its grid family, from the configs alone (no weights loaded)."""
    if spec.kind == "flow1d":
        grid = analytic_world(spec).grid  # the 1-D world's own (World1D.grid)
        return grid.sigmas(spec.steps)[::-1].copy(), grid
    from recast_cli.policy.families import policy_class

    sigmas, grid = policy_class(spec.kind).folder_grid(spec.folder(), spec.steps, spec.resolution)
    return sigmas[::-1].copy(), grid


def read_run_record(folder: Path) -> RunRecord:
    """``folder/run.json`` (``read_run``); BadInput for anything else (e.g. a stray run.json), worded for --out."""
    try:
        return read_run(folder)
    except RunRecordError as exc:
        if exc.problem in ("missing", "json"):
            raise BadInput(f"{exc.path} is not a {RUN_SCHEMA} record (not JSON)") from None
        if exc.problem in ("object", "schema", "config"):
            raise BadInput(f"{exc.path} is not a {RUN_SCHEMA} record (schema {exc.tag!r}); "
                           "choose another --out") from None
        raise


def check_same_run(state: dict, cfg: TrainConfig, w: WeightMatrix, weights: str, where: Path) -> None:
    if state.get("run_key") != cfg.run_key():
        raise BadInput(f"--resume: checkpoint {where} belongs to a run with another configuration "
                       f"(run key {state.get('run_key')}, this run {cfg.run_key()})")
    if state.get("weights_key") != weights_key(w):
        raise BadInput(f"--resume: checkpoint {where} was trained with another W than {weights}")


def run_inputs(setting: Setting, prompts: list[str]) -> dict[str, str]:
    """Label → digest of what a run trains besides its ``[train]`` table (the run key, which names the
    prompts file by path) and W (the W key): the setting's resolved ``[policy]`` and ``[world]`` (the
    analytic world; docs/method.md §4's when the setting has none), as ``recast study`` records them for its
    cells, and the prompts as read. Recorded in ``run.json`` and every checkpoint; ``--resume`` under
    others is refused (:func:`check_same_inputs`)."""
    return {**policy_inputs(setting), "[train] prompts": digest(prompts)}


def check_same_inputs(made: object, now: dict[str, str], what: str, setting: Setting) -> None:
    """BadInput naming what changed unless ``made`` (the inputs ``what`` recorded) equals ``now``: a run
    continued under another policy or world would mix two runs silently. A run that recorded none (an
    older recast's) cannot be checked, and is refused too."""
    if made == now:
        return
    if not isinstance(made, dict):
        raise BadInput(f"--resume: {what} was made by an older recast, which did not record the [policy] and "
                       f"[world] it trains; start a fresh --out")
    changed = [label for label in now if made.get(label) != now[label]] or ["[policy] and [world] record"]
    raise BadInput(f"--resume: {what} was made under another {' and '.join(changed)} than {setting.file} "
                   "holds now; restore it, or start a fresh --out")


def weights_key(w: WeightMatrix) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(w.W, dtype=np.float64).tobytes())
    digest.update(repr((tuple(w.rewards), w.mode)).encode())
    return digest.hexdigest()[:16]


def check_fsdp(cfg: TrainConfig, version: int, processes: int) -> None:
    """What the FSDP engine (``train/sharding``: FSDP2 over every process) runs; BadInput for the rest.

    It shards the LoRA run's transformer itself with torch's ``fully_shard`` (FSDP2); accelerate's
    FSDP1 plugin is not used. Full fine-tuning would keep a replicated frozen copy as the KL
    reference, and compiling the sharded transformer is untested: both are refused.
    """
    if version != 2:
        raise BadInput(f"recast train shards with FSDP2: set fsdp_version: 2 in the accelerate config (got {version}; "
                       "see pipelines/accelerate/fsdp.yaml)")
    if processes < 2:
        raise BadInput("an FSDP launch needs at least 2 processes (--num_processes); one process trains unsharded "
                       "without the FSDP config")
    if cfg.lora_rank == 0:
        raise BadInput("under FSDP recast train trains LoRA adapters only (lora_rank > 0), not the whole transformer")
    if cfg.compile:
        raise BadInput("compile = true is not supported under FSDP; drop it or use pipelines/accelerate/ddp.yaml")

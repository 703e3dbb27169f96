"""Checkpoints of a ``recast.run/1`` folder: written whole or not at all, verified on resume.

``RUN/checkpoints/step-NNNNNN/`` holds

* ``adapter/pytorch_lora_weights.safetensors`` — the LoRA adapter in diffusers' format
  (``adapter/diffusion_pytorch_model.safetensors`` for full fine-tuning), and
  ``adapter_ema/`` the EMA weights when EMA is on;
* ``state.safetensors`` — optimizer moments (by parameter name) and RNG states;
* ``state.json`` — step, data position, learning-rate schedule, optimizer hyper-parameters,
  the run key and the W it trained with (sha256 and provenance);
* ``manifest.json`` — schema, step and the sha256 of every file above, written last.

A checkpoint is assembled in a hidden temporary folder and renamed into place, so a failed
or killed save leaves the previous checkpoint as the latest good one. Old checkpoints are
removed only after a newer one is complete. No pickle anywhere. The tag, the listing of a
run's complete checkpoints and their verification need no torch: they are in ``artifacts/run.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from recast_cli.artifacts import CHECKPOINT_SCHEMA, latest_checkpoint, list_checkpoints, sha256_file, step_dir
from recast_cli.artifacts.run import CHECKPOINTS, MANIFEST_NAME, verify_checkpoint
from recast_cli.errors import BadInput
from recast_cli.train.sharding import full_tensor, shard_like

__all__ = ["CHECKPOINT_SCHEMA", "clean_partial", "latest_checkpoint", "list_checkpoints", "load_optimizer",
           "optimizer_tensors", "read_checkpoint", "restore_rng", "rng_tensors", "save_checkpoint", "step_dir"]


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())


#: The temporary folder of a checkpoint being saved (``tempfile.mkdtemp``: 8 random characters).
TEMP_NAME = re.compile(r"\.step-[0-9]{6}\.[a-z0-9_]{8}\.tmp")


def save_checkpoint(run: Path, step: int, write_files, tensors: dict[str, torch.Tensor], state: dict[str, Any],
                    keep: int) -> Path:
    """Assemble a checkpoint in a temporary folder, then rename it to ``step-NNNNNN``.

    ``write_files(folder)`` writes the model files (adapter, EMA); ``tensors`` and ``state``
    become ``state.safetensors`` and ``state.json``. Keeps the ``keep`` newest checkpoints.
    """
    root = run / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(run, step)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".step-{step:06d}.", suffix=".tmp"))
    try:
        write_files(tmp)
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(json.dumps(state, sort_keys=True, indent=1))
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST_NAME).write_text(json.dumps({"schema": CHECKPOINT_SCHEMA, "step": step, "files": files},
                                                    sort_keys=True, indent=1))
        _fsync_tree(tmp)
        os.chmod(tmp, 0o755)
        if final.exists():  # a checkpoint of the same step (a rerun): replace it only now
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for _, old in list_checkpoints(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def clean_partial(run: Path) -> None:
    """Remove temporary folders left by a save that was killed: only names of exactly the form
    ``save_checkpoint`` makes (``.step-NNNNNN.RANDOM.tmp``), never another file."""
    root = run / CHECKPOINTS
    if root.is_dir():
        for child in root.iterdir():
            if TEMP_NAME.fullmatch(child.name) and child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)


def read_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Verify a checkpoint against its manifest (``artifacts.run.verify_checkpoint``) and return
    (state tensors, state.json).

    BadInput names the problem: not a checkpoint, another schema, a file missing or changed, or
    verified files that do not parse.
    """
    verify_checkpoint(folder)
    try:
        tensors = load_file(str(folder / "state.safetensors"))
        state = json.loads((folder / "state.json").read_text())
    except Exception as exc:  # verified bytes that still do not parse: written by something else
        raise BadInput(f"checkpoint {folder} is unreadable ({type(exc).__name__})") from None
    return tensors, state


# ------------------------------------------------------------------ optimizer and RNG state, pickle-free


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """AdamW's per-parameter state keyed by parameter name, plus its hyper-parameters as JSON.

    Moments of sharded parameters are gathered whole (under FSDP every process calls this).
    """
    sd = optimizer.state_dict()
    tensors = {}
    for index, per_param in sorted(sd["state"].items()):
        for key, value in sorted(per_param.items()):
            tensors[f"optim/{names[index]}/{key}"] = full_tensor(value) if torch.is_tensor(value) else torch.tensor(value)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "names": names}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict,
                   names: list[str], where: str) -> None:
    """Load what ``optimizer_tensors`` wrote; moments of sharded parameters are split as their parameter is."""
    if meta.get("names") != names:
        raise BadInput(f"{where}: the optimizer state belongs to other parameters than this run trains")
    state: dict[int, dict[str, torch.Tensor]] = {}
    index = {n: i for i, n in enumerate(names)}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for key, value in tensors.items():
        if not key.startswith("optim/"):
            continue
        name, field = key[len("optim/"):].rsplit("/", 1)
        param = params[index[name]]
        state.setdefault(index[name], {})[field] = shard_like(value, param) if value.shape == param.shape else value
    groups = []
    current = optimizer.state_dict()["param_groups"]
    if len(meta["param_groups"]) != len(current):
        raise BadInput(f"{where}: optimizer has {len(meta['param_groups'])} parameter groups, this run {len(current)}")
    for saved, live in zip(meta["param_groups"], current):
        groups.append({**saved, "params": live["params"]})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng/torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng/cuda{i}"] = s
    return out


def restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["rng/torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)

"""A trained run's LoRA applied to a policy, through the loader a diffusers user would call.

``resolve_adapter`` finds the adapter file of a run folder (its latest complete checkpoint), a
checkpoint folder or the file; ``load_lora_into_policy`` applies it with the pipeline's own
``load_lora_weights``. ``recast estimate --policy RUN`` and ``recast evaluate --run`` use it;
the trainer writes the files (``recast_cli.train.params``).
"""

from __future__ import annotations

from pathlib import Path

from recast_cli.artifacts.run import LORA_FILE, find_checkpoint
from recast_cli.errors import BadInput

#: diffusers' safetensors metadata key for the LoraConfig of a LoRA file (``diffusers.loaders.lora_base``)
LORA_METADATA_KEY = "lora_adapter_metadata"


def load_lora_into_policy(policy, checkpoint: str | Path) -> Path:
    """Apply a checkpoint's LoRA adapter (a run folder, a checkpoint folder or the file) to an image policy
    (sd3, flux, qwenimage).

    Uses diffusers' ``load_lora_weights``, the loader a diffusers user would use, and fuses
    nothing: the adapter stays switchable. Returns the adapter file.
    """
    from safetensors import safe_open

    path = resolve_adapter(checkpoint)
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types
        raise BadInput(f"{path}: not a readable safetensors file ({type(exc).__name__})") from None
    if meta.get("recast.kind") == "lora" and LORA_METADATA_KEY not in meta:
        raise BadInput(f"{path} was written without its LoRA config ({LORA_METADATA_KEY}); diffusers would apply "
                       "it at the wrong scale")
    policy.pipe.load_lora_weights(str(path.parent), weight_name=path.name, adapter_name="recast")
    return path


def lora_parameters(transformer, targets: tuple[str, ...], rank: int) -> tuple[int, int]:
    """(LoRA parameters, targeted linear layers) of rank ``rank`` on the modules peft would match:
    r·(in + out) for every ``nn.Linear`` whose name is, or ends in ``.``, one of ``targets``."""
    import torch

    total = layers = 0
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (module.in_features + module.out_features)
            layers += 1
    return total, layers


def trained_parameters(transformer, rank: int, targets: tuple[str, ...]) -> int:
    """The parameters a run trains: its LoRA's (``rank`` > 0), else the whole transformer's."""
    if rank > 0:
        return lora_parameters(transformer, tuple(targets), rank)[0]
    return sum(p.numel() for p in transformer.parameters())


def resolve_adapter(checkpoint: str | Path) -> Path:
    """The adapter file of a run folder (its latest checkpoint), a checkpoint folder, its ``adapter/``
    or the file itself. The checkpoint is found by ``artifacts.run.find_checkpoint``, not verified:
    ``recast evaluate`` and ``recast estimate`` verified it when they resolved it."""
    p = Path(checkpoint)
    if p.is_file():
        return p
    found = find_checkpoint(p, str(p), record=False, verify=False)
    folder = found.folder if found is not None else p
    for candidate in (folder / "adapter" / LORA_FILE, folder / LORA_FILE):
        if candidate.is_file():
            return candidate
    raise BadInput(f"{checkpoint}: no LoRA adapter ({LORA_FILE}) found (a run folder, a checkpoint folder or the file)")

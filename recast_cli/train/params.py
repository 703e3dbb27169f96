"""What the trainer updates: a LoRA adapter on the transformer (peft), or the whole transformer.

The adapter is saved in diffusers' LoRA format (``pytorch_lora_weights.safetensors``, keys
``transformer.<module>.lora_A.weight`` …, and the LoRA config under the file's
``lora_adapter_metadata`` key, as diffusers' ``save_lora_weights`` writes it: without it
diffusers assumes ``lora_alpha = r`` and applies the adapter at the wrong scale), so
``StableDiffusion3Pipeline.load_lora_weights`` reads it; ``load_adapter_file`` reads it back into a peft-wrapped transformer for resume and
``--init``. The reference policy of the KL term is the same transformer with the adapter
disabled (LoRA) or a frozen copy (full fine-tuning).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from recast_cli.artifacts.run import FULL_FILE, LORA_FILE
from recast_cli.errors import BadInput
from recast_cli.policy.lora import LORA_METADATA_KEY
from recast_cli.train.sharding import full_tensor

PREFIX = "transformer."


class Parameters:
    """The trainable parameters of a transformer, by name, with the reference-policy switch."""

    def __init__(self, transformer: torch.nn.Module, rank: int, alpha: float, targets: tuple[str, ...], seed: int,
                 keep_reference: bool):
        self.transformer = transformer
        self.lora = rank > 0
        self.rank, self.alpha = rank, alpha
        if self.lora:
            from peft import LoraConfig

            names = [n for n, _ in transformer.named_modules()]
            for target in targets:
                if not any(n == target or n.endswith("." + target) for n in names):
                    raise BadInput(f"LoRA target {target!r} matches no module of the transformer")
            torch.manual_seed(seed)  # lora_A's gaussian init
            transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                               target_modules=list(targets)))
            self.reference = None
        else:
            transformer.requires_grad_(True)
            self.reference = copy.deepcopy(transformer).requires_grad_(False) if keep_reference else None
        self.named = sorted((n, p) for n, p in transformer.named_parameters() if p.requires_grad)
        if not self.named:
            raise BadInput("nothing to train: no parameter requires a gradient")

    def bind_sharded(self) -> None:
        """The transformer was sharded (FSDP2 replaces its parameters by DTensors): take the new
        parameter objects. ``state`` then gathers the shards, so every process must call it."""
        self.named = sorted((n, p) for n, p in self.transformer.named_parameters() if p.requires_grad)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.named]

    @property
    def tensors(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named]

    def count(self) -> int:
        return sum(p.numel() for p in self.tensors)

    @contextlib.contextmanager
    def reference_policy(self, policy) -> Iterator[None]:
        """Inside the block ``policy`` is the reference: adapter disabled, or the frozen copy."""
        if self.lora:
            self.transformer.disable_adapters()
            try:
                yield
            finally:
                self.transformer.enable_adapters()
        else:
            if self.reference is None:
                raise RuntimeError("full fine-tuning without a kept reference has no KL term")
            live = policy.denoiser
            policy.denoiser = self.reference
            try:
                yield
            finally:
                policy.denoiser = live

    # ------------------------------------------------------------------ files

    def state(self, values: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The trained tensors as written to disk (diffusers key names, contiguous CPU copies).

        ``values`` (by parameter name, e.g. the EMA) replace the live parameters. Sharded tensors
        are gathered whole: under FSDP every process calls this and gets the full tensors.
        """
        values = dict(self.named) if values is None else values
        if self.lora:
            from peft.utils import get_peft_model_state_dict

            whole = {n: full_tensor(values[n]) for n in self.names}
            raw = get_peft_model_state_dict(self.transformer, state_dict=whole)
            return {PREFIX + k: v.detach().to("cpu").contiguous().clone() for k, v in raw.items()}
        raw = {k: full_tensor(values.get(k, v)) for k, v in self.transformer.state_dict().items()}
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in raw.items()}

    def save(self, folder: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
        """Write the adapter (or the transformer) into ``folder``; returns the file."""
        folder.mkdir(parents=True, exist_ok=True)
        tensors = self.state() if tensors is None else tensors
        path = folder / (LORA_FILE if self.lora else FULL_FILE)
        meta = {"format": "pt", "recast.kind": "lora" if self.lora else "full"}
        if self.lora:
            meta[LORA_METADATA_KEY] = json.dumps(self.lora_metadata(tensors), sort_keys=True)
        save_file(tensors, str(path), metadata=meta)
        return path

    def lora_metadata(self, tensors: dict[str, torch.Tensor]) -> dict:
        """The LoraConfig diffusers rebuilds the adapter from (keys prefixed by the component)."""
        modules = sorted({k[len(PREFIX):].split(".lora_")[0] for k in tensors})
        config = {"r": self.rank, "lora_alpha": self.alpha, "target_modules": modules}
        return {PREFIX + k: v for k, v in config.items()}

    def load(self, folder: Path) -> None:
        """Load what ``save`` wrote; BadInput if it does not fit this transformer."""
        path = folder / (LORA_FILE if self.lora else FULL_FILE)
        if not path.is_file():
            other = folder / (FULL_FILE if self.lora else LORA_FILE)
            kind = "a full fine-tune" if other.is_file() else "nothing readable"
            raise BadInput(f"{folder} holds {kind}, not the {'LoRA adapter' if self.lora else 'full transformer'} "
                           "this run trains")
        tensors = _read(path)
        self.load_tensors(tensors, str(path))

    def load_tensors(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        expected = self.state()
        if set(tensors) != set(expected):
            missing = sorted(set(expected) - set(tensors))
            extra = sorted(set(tensors) - set(expected))
            what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
            raise BadInput(f"{where} does not fit this model and LoRA config ({what})")
        for key, value in tensors.items():
            if value.shape != expected[key].shape:
                raise BadInput(f"{where}: {key} has shape {list(value.shape)}, this run needs {list(expected[key].shape)}")
        with torch.no_grad():
            if self.lora:
                from peft.utils import set_peft_model_state_dict

                set_peft_model_state_dict(self.transformer, {k[len(PREFIX):]: v for k, v in tensors.items()})
            else:
                self.transformer.load_state_dict(tensors)
        # peft may rebuild nothing, but make sure the live tensors equal the file bit for bit
        now = self.state()
        if any(not torch.equal(now[k], tensors[k].to(now[k].dtype)) for k in tensors):
            raise RuntimeError(f"loading {where} did not reproduce its tensors")


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise BadInput(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0] if str(exc) else exc})") from None

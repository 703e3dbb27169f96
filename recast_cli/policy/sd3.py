"""The SD3 / SD3.5 policy over diffusers, loaded from a local folder in the SD3.5-Medium layout.

The same loader serves the real model and the toy world's tiny SD3-architecture model:
``StableDiffusion3Pipeline.from_pretrained(folder)`` with ``local_files_only``; the T5 text
encoder (``text_encoder_3``) is optional, as in diffusers (its embeddings are then zeros).
The transformer's output is the rectified-flow velocity v = ε − x_0, evaluated at
``timestep = 1000·σ`` per sample, so mixed-σ batches are one model call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from recast_cli.errors import BadInput
from recast_cli.policy.base import FlowPolicy

REQUIRED_COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler")
OPTIONAL_COMPONENTS = ("text_encoder_3", "tokenizer_3")
PRECISIONS = {"no": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class SD3Conditioning:
    """Per-sample text conditioning; ``negative_*`` are the unconditional embeddings for CFG."""

    prompt_embeds: torch.Tensor
    pooled: torch.Tensor
    negative_embeds: torch.Tensor
    negative_pooled: torch.Tensor

    def take(self, index: torch.Tensor) -> SD3Conditioning:
        index = index.to(self.prompt_embeds.device)
        return SD3Conditioning(self.prompt_embeds[index], self.pooled[index],
                               self.negative_embeds[index], self.negative_pooled[index])

    @staticmethod
    def cat(parts: Sequence[SD3Conditioning]) -> SD3Conditioning:
        return SD3Conditioning(*(torch.cat([getattr(p, f) for p in parts]) for f in
                                 ("prompt_embeds", "pooled", "negative_embeds", "negative_pooled")))


def check_model_folder(folder: str | Path) -> Path:
    """BadInput naming what is missing unless ``folder`` holds an SD3 pipeline in diffusers layout."""
    path = Path(folder)
    if not path.is_dir():
        raise BadInput(f"model folder {path} does not exist")
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise BadInput(f"{path} is not a diffusers model folder (no model_index.json)")
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError:
        raise BadInput(f"{index_file} is not valid JSON") from None
    for name in REQUIRED_COMPONENTS:
        entry = index.get(name)
        if not entry or entry[0] is None:
            raise BadInput(f"{path}: model_index.json names no {name!r} component")
        if not (path / name).is_dir():
            raise BadInput(f"{path}: component folder {name}/ is missing")
    for name in OPTIONAL_COMPONENTS:
        entry = index.get(name)
        if entry and entry[0] is not None and not (path / name).is_dir():
            raise BadInput(f"{path}: model_index.json names {name!r} but {name}/ is missing")
    return path


class SD3Policy(FlowPolicy):
    """SD3 / SD3.5 through diffusers' pipeline components, with CFG and a per-sample σ."""

    def __init__(self, pipe, steps: int, guidance_scale: float = 4.5, resolution: int | None = None,
                 max_sequence_length: int = 256, precision: str = "auto", device: str | torch.device | None = None):
        if steps < 1:
            raise BadInput(f"steps must be at least 1, got {steps}")
        if guidance_scale < 0:
            raise BadInput(f"guidance scale must be >= 0, got {guidance_scale}")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if precision == "auto":
            precision = "bf16" if device.type == "cuda" else "no"
        if precision not in PRECISIONS:
            raise BadInput(f"precision must be one of auto, {', '.join(PRECISIONS)}; got {precision!r}")
        if device.type == "cpu" and precision != "no" and precision != "fp32":
            raise BadInput("mixed precision needs a CUDA device; use precision 'no' on the CPU")
        self.pipe = pipe.to(device)
        self._device = device
        self.autocast_dtype = PRECISIONS[precision]
        self.guidance_scale = float(guidance_scale)
        self.max_sequence_length = max_sequence_length
        scale = self.pipe.vae_scale_factor
        size = resolution or self.pipe.default_sample_size * scale
        if size % (scale * self.pipe.patch_size):
            raise BadInput(f"resolution {size} must be a multiple of {scale * self.pipe.patch_size}")
        self.resolution = size
        self._latent_shape = (self.pipe.transformer.config.in_channels, size // scale, size // scale)
        scheduler = self.pipe.scheduler
        scheduler.set_timesteps(steps)
        self.sigmas = scheduler.sigmas.detach().to("cpu", torch.float64).flip(0)
        self.shift = float(scheduler.config.shift)
        self._cache: dict[str, SD3Conditioning] = {}
        #: the module ``velocity`` calls: the transformer, or the trainer's (DDP-)wrapped copy of it
        self.denoiser = self.pipe.transformer
        for module in (self.pipe.transformer, self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2,
                       self.pipe.text_encoder_3):
            if module is not None:
                module.eval()
                module.requires_grad_(False)

    @property
    def network(self) -> torch.nn.Module:
        """The network the trainer updates (LoRA or in full): the transformer, unwrapped."""
        return self.pipe.transformer

    @classmethod
    def from_pretrained(cls, folder: str | Path, steps: int, guidance_scale: float = 4.5, resolution: int | None = None,
                        max_sequence_length: int = 256, precision: str = "auto",
                        device: str | torch.device | None = None) -> SD3Policy:
        """Load an SD3 pipeline folder (SD3.5-Medium layout) with no network access."""
        from diffusers import StableDiffusion3Pipeline
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        for lib in (diffusers_logging, transformers_logging):
            lib.set_verbosity_error()  # load reports and tokenizer truncation notes are noise here
            lib.disable_progress_bar()
        path = check_model_folder(folder)
        index = json.loads((path / "model_index.json").read_text())
        extra = {name: None for name in OPTIONAL_COMPONENTS if not (index.get(name) or [None])[0]}
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        load_dtype = torch.float32 if dev.type == "cpu" else PRECISIONS.get(
            "bf16" if precision == "auto" else precision, torch.float32)
        try:
            pipe = StableDiffusion3Pipeline.from_pretrained(path, dtype=load_dtype, local_files_only=True, **extra)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"cannot load the SD3 pipeline from {path}: {first}") from None
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, steps, guidance_scale, resolution, max_sequence_length, precision, dev)

    # ------------------------------------------------------------------ protocol

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self._latent_shape

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def do_cfg(self) -> bool:
        return self.guidance_scale > 1.0

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> SD3Conditioning:
        """Text embeddings per prompt (both CLIPs, T5 when present), cached by prompt text."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        if missing:
            embeds, negative, pooled, negative_pooled = self.pipe.encode_prompt(
                prompt=missing, prompt_2=None, prompt_3=None, device=self.device,
                do_classifier_free_guidance=True, negative_prompt="",
                max_sequence_length=self.max_sequence_length)
            for i, prompt in enumerate(missing):
                self._cache[prompt] = SD3Conditioning(
                    embeds[i : i + 1].float(), pooled[i : i + 1].float(),
                    negative[i : i + 1].float(), negative_pooled[i : i + 1].float())
        return SD3Conditioning.cat([self._cache[p] for p in prompts])

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: SD3Conditioning) -> torch.Tensor:
        timestep = sigma.to(self.device, torch.float32) * self.pipe.scheduler.config.num_train_timesteps
        if self.do_cfg:
            hidden = torch.cat([x, x])
            timestep = torch.cat([timestep, timestep])
            text = torch.cat([cond.negative_embeds, cond.prompt_embeds])
            pooled = torch.cat([cond.negative_pooled, cond.pooled])
        else:
            hidden, text, pooled = x, cond.prompt_embeds, cond.pooled
        with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype != torch.float32):
            out = self.denoiser(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text,
                                        pooled_projections=pooled, return_dict=False)[0]
        out = out.float()
        if self.do_cfg:
            uncond, text_pred = out.chunk(2)
            return uncond + self.guidance_scale * (text_pred - uncond)
        return out

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        images = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return ((images.float() + 1) / 2).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        dist = vae.encode((images.to(self.device, vae.dtype) * 2 - 1)).latent_dist
        return ((dist.mean.float() - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor)

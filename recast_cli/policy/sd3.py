"""The SD3 / SD3.5 policy over diffusers, loaded from a local folder in the SD3.5-Medium layout.

The same loader serves the real model and the toy world's tiny SD3-architecture model:
``StableDiffusion3Pipeline.from_pretrained(folder)`` with ``local_files_only``; the T5 text
encoder (``text_encoder_3``) is optional, as in diffusers (its embeddings are then zeros).
The transformer's output is the rectified-flow velocity v = ε − x_0, evaluated at
``timestep = 1000·σ`` per sample, so mixed-σ batches are one model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recast_cli.grid import GridSpec
from recast_cli.policy.pipeline import PRECISIONS, PipelinePolicy

REQUIRED_COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler")
OPTIONAL_COMPONENTS = ("text_encoder_3", "tokenizer_3")
__all__ = ["PRECISIONS", "SD3Conditioning", "SD3Policy", "check_model_folder"]


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
    return SD3Policy.check_folder(folder)


class SD3Policy(PipelinePolicy):
    """SD3 / SD3.5 through diffusers' pipeline components, with CFG and a per-sample σ."""

    FAMILY = "sd3"
    PIPELINE = "StableDiffusion3Pipeline"
    REQUIRED_COMPONENTS = REQUIRED_COMPONENTS
    OPTIONAL_COMPONENTS = OPTIONAL_COMPONENTS
    PACK = 1  # the SD3 transformer patches the latent itself

    def __init__(self, pipe, steps: int, guidance_scale: float = 4.5, resolution: int | None = None,
                 max_sequence_length: int = 256, precision: str = "auto", device: str | torch.device | None = None,
                 offload_text_encoders: bool = False):
        super().__init__(pipe, steps, guidance_scale, resolution, max_sequence_length, precision, device,
                         offload_text_encoders)
        self.shift = float(self.pipe.scheduler.config.shift)

    @classmethod
    def from_pretrained(cls, folder: str | Path, steps: int, guidance_scale: float = 4.5, resolution: int | None = None,
                        max_sequence_length: int = 256, precision: str = "auto",
                        device: str | torch.device | None = None, offload_text_encoders: bool | None = None,
                        trainable=None) -> SD3Policy:
        """Load an SD3 pipeline folder (SD3.5-Medium layout) with no network access."""
        return super().from_pretrained(folder, steps, guidance_scale, resolution, max_sequence_length, precision,
                                       device, offload_text_encoders, trainable)

    @classmethod
    def latent_channels(cls, transformer: dict[str, Any], vae: dict[str, Any]) -> int:
        return int(transformer["in_channels"])

    @classmethod
    def default_sample_size(cls, transformer: dict[str, Any]) -> int:
        return int(transformer.get("sample_size") or 128)

    @classmethod
    def grid(cls, scheduler, steps: int, tokens: int) -> tuple[np.ndarray, GridSpec]:
        """SD3's grid: ``set_timesteps(T)`` of the shifted flow-matching scheduler (``flowmatch``)."""
        scheduler.set_timesteps(steps)
        spec = GridSpec("flowmatch", shift=float(scheduler.config.shift),
                        num_train_timesteps=int(scheduler.config.num_train_timesteps))
        return scheduler.sigmas.detach().to("cpu", torch.float64).flip(0).numpy(), spec

    # ------------------------------------------------------------------ protocol

    @property
    def do_cfg(self) -> bool:
        return self.guidance_scale > 1.0

    def encode_missing(self, prompts: list[str]) -> list[SD3Conditioning]:
        """Text embeddings per prompt (both CLIPs, T5 when present); the negative prompt is ""."""
        embeds, negative, pooled, negative_pooled = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.device,
            do_classifier_free_guidance=True, negative_prompt="",
            max_sequence_length=self.max_sequence_length)
        return [SD3Conditioning(embeds[i : i + 1].float(), pooled[i : i + 1].float(),
                                negative[i : i + 1].float(), negative_pooled[i : i + 1].float())
                for i in range(len(prompts))]

    def join(self, parts: list[SD3Conditioning]) -> SD3Conditioning:
        return SD3Conditioning.cat(parts)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: SD3Conditioning) -> torch.Tensor:
        timestep = sigma.to(self.device, torch.float32) * self.pipe.scheduler.config.num_train_timesteps
        if self.do_cfg:
            hidden = torch.cat([x, x])
            timestep = torch.cat([timestep, timestep])
            text = torch.cat([cond.negative_embeds, cond.prompt_embeds])
            pooled = torch.cat([cond.negative_pooled, cond.pooled])
        else:
            hidden, text, pooled = x, cond.prompt_embeds, cond.pooled
        with self.autocast():
            out = self.denoiser(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text,
                                pooled_projections=pooled, return_dict=False)[0]
        out = out.float()
        if self.do_cfg:
            uncond, text_pred = out.chunk(2)
            return uncond + self.guidance_scale * (text_pred - uncond)
        return out

"""The FLUX.1 policy (``kind = "flux"``): ``FluxPipeline`` / ``FluxTransformer2DModel`` from a local folder.

FLUX.1-dev is guidance-distilled: the guidance value g is an input of the transformer (its
guidance embedding), not classifier-free guidance. π^old is therefore the model's velocity at
g = ``[policy] guidance_scale`` (FLUX.1-dev's default 3.5): one transformer call per step, no
negative prompt, and the E1 log-probabilities are those of that single velocity. A model
without a guidance embedding (FLUX.1-schnell) ignores g.

The transformer sees the latent ``[16, h, w]`` as (h/2)(w/2) tokens of 2 × 2 patches, with
the pipeline's image position ids; ``timestep`` is σ per sample (the pipeline passes t/1000),
so a mixed-σ batch is one call. The grid is the pipeline's: ``set_timesteps(sigmas =
linspace(1, 1/T, T), mu)`` with FLUX.1-dev's dynamic shift μ from the token count (512 px:
1024 tokens, μ = 0.63), so a W or gain table is tied to the resolution it was made at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recast_cli.policy.pipeline import PipelinePolicy


@dataclass(frozen=True)
class FluxConditioning:
    """Per-sample T5 embeddings and the CLIP pooled embedding (no negative: FLUX.1 is guidance-distilled)."""

    prompt_embeds: torch.Tensor
    pooled: torch.Tensor

    def take(self, index: torch.Tensor) -> FluxConditioning:
        index = index.to(self.prompt_embeds.device)
        return FluxConditioning(self.prompt_embeds[index], self.pooled[index])

    @staticmethod
    def cat(parts: Sequence[FluxConditioning]) -> FluxConditioning:
        return FluxConditioning(torch.cat([p.prompt_embeds for p in parts]), torch.cat([p.pooled for p in parts]))


class FluxPolicy(PipelinePolicy):
    """FLUX.1-dev / -schnell through diffusers' ``FluxPipeline`` components."""

    FAMILY = "flux"
    PIPELINE = "FluxPipeline"
    REQUIRED_COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
                           "scheduler")

    def __init__(self, pipe, steps: int, guidance_scale: float = 3.5, resolution: int | None = None,
                 max_sequence_length: int = 512, precision: str = "auto", device: str | torch.device | None = None,
                 offload_text_encoders: bool = False):
        super().__init__(pipe, steps, guidance_scale, resolution, max_sequence_length, precision, device,
                         offload_text_encoders)
        _, h, w = self.latent_shape
        self._img_ids = self.pipe._prepare_latent_image_ids(1, h // 2, w // 2, self.device, torch.float32)
        self.guided = bool(self.pipe.transformer.config.guidance_embeds)

    def encode_missing(self, prompts: list[str]) -> list[FluxConditioning]:
        embeds, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=self.device,
                                                    max_sequence_length=self.max_sequence_length)
        return [FluxConditioning(embeds[i : i + 1].float(), pooled[i : i + 1].float()) for i in range(len(prompts))]

    def join(self, parts: list[FluxConditioning]) -> FluxConditioning:
        return FluxConditioning.cat(parts)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: FluxConditioning) -> torch.Tensor:
        n = x.shape[0]
        timestep = sigma.to(self.device, torch.float32) * self.pipe.scheduler.config.num_train_timesteps / 1000
        guidance = torch.full((n,), self.guidance_scale, device=self.device) if self.guided else None
        text_ids = torch.zeros(cond.prompt_embeds.shape[1], 3, device=self.device)
        with self.autocast():
            out = self.denoiser(hidden_states=self.pack(x), timestep=timestep, guidance=guidance,
                                pooled_projections=cond.pooled, encoder_hidden_states=cond.prompt_embeds,
                                txt_ids=text_ids, img_ids=self._img_ids, return_dict=False)[0]
        return self.unpack(out.float())

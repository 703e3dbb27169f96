"""The Qwen-Image policy (``kind = "qwenimage"``): ``QwenImagePipeline`` from a local folder.

Qwen-Image uses true classifier-free guidance: with s = ``[policy] guidance_scale`` (the
pipeline's ``true_cfg_scale``; Qwen-Image's default 4.0) > 1 the velocity is the pipeline's
``v = v_neg + s·(v_cond − v_neg)`` rescaled per token to the norm of ``v_cond``, with the
negative prompt " " (Qwen-Image's recommended empty negative); s ≤ 1 is the conditional
velocity alone. Both halves run in one transformer call: the text sequences of a batch are
padded to a common length and masked (``encoder_hidden_states_mask``), as the pipeline does
for a batch of prompts.

Latents are ``[16, h, w]`` in the VAE's normalised space ((z − latents_mean) / latents_std of
``AutoencoderKLQwenImage``, a one-frame video VAE), packed into 2 × 2-patch tokens inside
``velocity``; ``timestep`` is σ per sample. The grid is the pipeline's: ``set_timesteps(sigmas =
linspace(1, 1/T, T), mu)`` with the dynamic shift μ of the token count and the scheduler's
stretch to ``shift_terminal`` (0.02).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recast_cli.policy.pipeline import PipelinePolicy

NEGATIVE_PROMPT = " "


def pad_rows(rows: Sequence[torch.Tensor], length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, L_i, D] rows → ([n, L, D] zero-padded, [n, L] bool mask of the real tokens)."""
    length = length or max(r.shape[1] for r in rows)
    embeds = torch.zeros(len(rows), length, rows[0].shape[2], dtype=rows[0].dtype, device=rows[0].device)
    mask = torch.zeros(len(rows), length, dtype=torch.bool, device=rows[0].device)
    for i, row in enumerate(rows):
        embeds[i, : row.shape[1]] = row[0]
        mask[i, : row.shape[1]] = True
    return embeds, mask


@dataclass(frozen=True)
class QwenConditioning:
    """Per-sample text embeddings with their masks, for the prompt and the negative prompt."""

    prompt_embeds: torch.Tensor
    mask: torch.Tensor
    negative_embeds: torch.Tensor
    negative_mask: torch.Tensor

    def take(self, index: torch.Tensor) -> QwenConditioning:
        index = index.to(self.prompt_embeds.device)
        return QwenConditioning(self.prompt_embeds[index], self.mask[index], self.negative_embeds[index],
                                self.negative_mask[index])


class QwenImagePolicy(PipelinePolicy):
    """Qwen-Image through diffusers' ``QwenImagePipeline`` components, with true CFG."""

    FAMILY = "qwenimage"
    PIPELINE = "QwenImagePipeline"
    REQUIRED_COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")

    @classmethod
    def vae_scale_factor(cls, vae: dict[str, Any]) -> int:
        return 2 ** len(vae.get("temperal_downsample") or [])

    @property
    def do_cfg(self) -> bool:
        return self.guidance_scale > 1.0

    def encode_missing(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [1, L_i, D] embedding per prompt, its padding removed (the cache holds the negative too)."""
        embeds, mask = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                               max_sequence_length=self.max_sequence_length)
        lengths = [embeds.shape[1]] * len(prompts) if mask is None else mask.sum(dim=1).tolist()
        return [embeds[i : i + 1, : int(n)].float() for i, n in enumerate(lengths)]

    def join(self, parts: list[torch.Tensor]) -> QwenConditioning:
        negative = self.encode_negative()
        length = max(max(p.shape[1] for p in parts), negative.shape[1])
        embeds, mask = pad_rows(parts, length)
        neg, neg_mask = pad_rows([negative] * len(parts), length)
        return QwenConditioning(embeds, mask, neg, neg_mask)

    def encode_negative(self) -> torch.Tensor:
        if NEGATIVE_PROMPT not in self._cache:
            with self.text_encoders_on_device():
                self._cache[NEGATIVE_PROMPT] = self.encode_missing([NEGATIVE_PROMPT])[0]
        return self._cache[NEGATIVE_PROMPT]

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: QwenConditioning) -> torch.Tensor:
        n = x.shape[0]
        _, h, w = self.latent_shape
        tokens = self.pack(x)
        timestep = sigma.to(self.device, torch.float32) * self.pipe.scheduler.config.num_train_timesteps / 1000
        text, mask = cond.prompt_embeds, cond.mask
        if self.do_cfg:
            tokens, timestep = torch.cat([tokens, tokens]), torch.cat([timestep, timestep])
            text, mask = torch.cat([cond.negative_embeds, text]), torch.cat([cond.negative_mask, mask])
        with self.autocast():
            out = self.denoiser(hidden_states=tokens, timestep=timestep, guidance=None, encoder_hidden_states=text,
                                encoder_hidden_states_mask=mask, img_shapes=[[(1, h // 2, w // 2)]] * len(tokens),
                                return_dict=False)[0]
        out = out.float()
        if self.do_cfg:
            negative, conditional = out.chunk(2)
            combined = negative + self.guidance_scale * (conditional - negative)
            out = combined * (conditional.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))
        return self.unpack(out[:n])

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.pipe.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        return (torch.tensor(config.latents_mean, device=self.device).view(shape),
                torch.tensor(config.latents_std, device=self.device).view(shape))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → images in [0, 1] (the pipeline's un-normalisation, one frame)."""
        vae = self.pipe.vae
        mean, std = self._moments()
        z = latents.unsqueeze(2) * std + mean
        images = vae.decode(z.to(vae.dtype), return_dict=False)[0][:, :, 0]
        return ((images.float() + 1) / 2).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] → normalised latents (the posterior mean of a one-frame video)."""
        vae = self.pipe.vae
        mean, std = self._moments()
        dist = vae.encode((images.to(self.device, vae.dtype) * 2 - 1).unsqueeze(2)).latent_dist
        return ((dist.mean.float() - mean) / std)[:, :, 0]

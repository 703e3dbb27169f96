"""The arithmetic of a training step of an SD3 setting, from its architecture (docs/gpu.md, "Compute").

Counted on the transformer built on the meta device, for one sample (one image of one prompt):

* every ``nn.Linear`` and ``nn.Conv2d`` at 2 FLOP per multiply-add, times the rows it sees: the image
  tokens (the image stream: ``attn``, ``attn2``, ``ff``, the patch embedding, ``proj_out``), the text
  tokens (the context stream: ``add_*_proj``, ``to_add_out``, ``ff_context``, ``context_embedder``) or
  one row (the adaLN modulations and the timestep and pooled-text embedders, which see one vector per
  sample);
* attention: 4·n²·d per layer (QKᵀ and AV), n the image plus text tokens of a joint block's ``attn``
  and the image tokens of its ``attn2``, d its inner dimension;
* image tokens (resolution / 8 / patch)², text tokens 77 (CLIP) + ``max_sequence_length`` (T5).

The text encoders (once per prompt) and the VAE (once per image) are left out: at SD3.5-M's sizes they
are about 1 % of a step. A step of ``recast train`` then samples every image over the policy's
``steps`` (×2 with classifier-free guidance) and trains each (image, trained step) pair once: a forward,
the backward through the activations (LoRA's own weight gradients are small; the frozen weights get
none) and, with gradient checkpointing, the forward again.
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: Linear layers that see the text tokens (the context stream of an MM-DiT block), by name part.
TEXT_PARTS = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff_context", "context_embedder")
#: Linear layers that see one row per sample (adaLN modulation, timestep and pooled-text embedders).
SAMPLE_PARTS = ("norm1", "norm1_context", "norm_out", "time_text_embed")
CLIP_TOKENS = 77
VAE_SCALE = 8


def forward_flops(transformer: nn.Module, image_tokens: int, text_tokens: int) -> dict[str, float]:
    """FLOP of one forward pass of one sample: {"linear", "attention", "total"} (module docstring)."""
    linear = attention = 0.0
    for name, module in transformer.named_modules():
        parts = name.split(".")
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            macs = module.weight.numel()
            if isinstance(module, nn.Conv2d):  # the patch embedding: one output position per image token
                rows = image_tokens
            elif any(p in SAMPLE_PARTS for p in parts):
                rows = 1
            elif any(p in TEXT_PARTS for p in parts):
                rows = text_tokens
            else:
                rows = image_tokens
            linear += 2.0 * macs * rows
        elif parts[-1] in ("attn", "attn2") and hasattr(module, "to_q"):
            joint = parts[-1] == "attn" and getattr(module, "add_q_proj", None) is not None
            n = image_tokens + text_tokens if joint else image_tokens
            attention += 4.0 * n * n * module.to_q.out_features
    return {"linear": linear, "attention": attention, "total": linear + attention}


def step_compute(transformer: nn.Module, policy, cfg, trained_steps: int) -> dict[str, Any]:
    """FLOP per image and per training step of ``recast train`` with the setting's ``[policy]`` and ``[train]``."""
    patch = int(getattr(transformer.config, "patch_size", 2))
    image_tokens = (policy.resolution // VAE_SCALE // patch) ** 2
    text_tokens = CLIP_TOKENS + int(policy.max_sequence_length)
    forward = forward_flops(transformer, image_tokens, text_tokens)["total"]
    passes = 2 if policy.guidance_scale > 1 else 1
    train_factor = 3 if cfg.gradient_checkpointing else 2
    sample = policy.steps * passes * forward
    train = trained_steps * passes * forward * train_factor
    images = cfg.group_size * cfg.prompts_per_step
    return {"image_tokens": image_tokens, "text_tokens": text_tokens, "forward_flops": forward,
            "cfg_passes": passes, "sampling_steps": policy.steps, "trained_steps": trained_steps,
            "train_passes": train_factor, "sample_flops_per_image": sample, "train_flops_per_image": train,
            "images_per_step": images, "flops_per_step": images * (sample + train)}

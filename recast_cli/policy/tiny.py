"""``recast tiny-model``: random-initialised pipelines of each family's real architecture, CPU-sized.

The same diffusers and transformers classes as the real checkpoints, scaled down so one build
takes seconds on a CPU and one denoising step milliseconds, saved in diffusers' folder layout
and loadable by the family's own ``from_pretrained``:

* ``sd3``: ``StableDiffusion3Pipeline`` (``SD3Transformer2DModel`` with RMS q/k-norm and a
  dual-attention layer, two CLIP text encoders with projection, T5) — the toy model's builder
  (``recast_cli.toy.model``) with the T5 encoder;
* ``flux``: ``FluxPipeline`` (``FluxTransformer2DModel`` with double- and single-stream blocks and
  guidance embedding, as FLUX.1-dev; CLIP + T5; a dynamically shifted flow-matching grid);
* ``qwenimage``: ``QwenImagePipeline`` (``QwenImageTransformer2DModel``, the ``AutoencoderKLQwenImage``
  video-style VAE, a Qwen2.5-VL text encoder; true CFG).

Text goes through the offline word-level tokenizer of the toy model (the toy vocabulary plus
any words of ``--prompts``; other words are ``<unk>``): a smoke test needs the code paths, not
the language. Weights are random (seeded): images are noise by design.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recast_cli import __version__
from recast_cli.errors import BadInput
from recast_cli.policy.families import family as family_of
from recast_cli.policy.families import load

MANIFEST = "recast-tiny-model.json"
IMAGE_SIZE = 32
TEXT_HIDDEN = 32  # the toy model's CLIP width


def build_pipeline(family: str, words: Sequence[str], seed: int = 0):
    """A random-initialised tiny pipeline of ``family`` (deterministic from ``seed``): the family table's
    ``tiny`` builder (recast_cli/policy/families.py)."""
    builder = load(family_of(family, "--family").tiny)
    torch.manual_seed(seed)
    return builder(words, seed)


def sd3_pipeline(words: Sequence[str], seed: int = 0):
    """SD3's tiny architecture: the toy model's, with its T5 encoder."""
    from recast_cli.toy.model import build_pipeline as build_sd3

    return build_sd3(words, with_t5=True, seed=seed, image_size=IMAGE_SIZE)


def flux_pipeline(words: Sequence[str], seed: int = 0):
    """FLUX.1's tiny architecture (the global seed set by :func:`build_pipeline`)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from recast_cli.toy.model import MAX_TOKENS, T5_HIDDEN, tiny_t5, tiny_vae, word_tokenizer

    tokenizer = word_tokenizer(words)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=MAX_TOKENS, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=T5_HIDDEN, pooled_projection_dim=TEXT_HIDDEN, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    return FluxPipeline(scheduler=scheduler, vae=tiny_vae(IMAGE_SIZE), text_encoder=clip, tokenizer=tokenizer,
                        text_encoder_2=tiny_t5(tokenizer), tokenizer_2=word_tokenizer(words), transformer=transformer)


def qwenimage_pipeline(words: Sequence[str], seed: int = 0):
    """Qwen-Image's tiny architecture (the global seed set by :func:`build_pipeline`)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from recast_cli.toy.model import word_tokenizer

    tokenizer = word_tokenizer(words, max_length=1024)  # the pipeline's prompt template is long
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                         **ids),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_HIDDEN,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0]),
        vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, **ids)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, attn_scales=[],
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                              attention_head_dim=16, num_attention_heads=2,
                                              joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                                                time_shift_type="exponential")
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=Qwen2_5_VLForConditionalGeneration(config),
                             tokenizer=tokenizer, transformer=transformer)


def parameter_counts(pipe) -> dict[str, int]:
    """Parameters per model component of a pipeline."""
    return {name: sum(p.numel() for p in module.parameters())
            for name, module in pipe.components.items() if isinstance(module, torch.nn.Module)}


def write_tiny_model(family: str, out: str | os.PathLike[str], seed: int = 0,
                     prompts: Sequence[str] = ()) -> dict[str, Any]:
    """Build and save the tiny pipeline into ``out`` (a new or empty folder), whole or not at all.

    The folder is written beside ``out`` and renamed into place; ``recast-tiny-model.json``
    records the family, seed, vocabulary size and parameter counts.
    """
    from recast_cli.toy.renderer import all_prompts

    out = Path(out)
    family_of(family, "--family")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"--out {out} exists and is not an empty folder; choose a new one")
    words = sorted({w for p in (*all_prompts(), *prompts) for w in p.lower().split()})
    pipe = build_pipeline(family, words, seed)
    record = {"family": family, "pipeline": type(pipe).__name__, "seed": seed, "recast_version": __version__,
              "vocabulary": len(words), "image_size": IMAGE_SIZE, "parameters": parameter_counts(pipe)}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tiny-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        pipe.save_pretrained(staging, safe_serialization=True)
        (staging / MANIFEST).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        if out.is_dir():
            out.rmdir()  # empty, checked above
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record

"""Tiny randomly initialised models of the real scorer architectures, saved the way their weights ship.

Shared by the tests and ``benchmarks/bench_rewards.py``.

* ``save_tiny_clip``: a transformers ``CLIPModel`` + ``CLIPProcessor`` folder (the layout of
  openai/clip-vit-large-patch14 and yuvalkirstain/PickScore_v1), 32-pixel images, 16-d
  projection, a byte-level BPE vocabulary with no merges, logit scale 50.
* ``save_tiny_hps``: a small open_clip CLIP (JSON model config) and its ``{"state_dict": ...}``
  checkpoint, the layout of HPS_v2.1_compressed.pt.
* ``save_tiny_aesthetic_head``: the LAION aesthetic MLP over 16-d features.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

IMAGE_SIZE = 32
HPS_ARCH = "tiny-hps-vit"


def save_tiny_clip(folder: Path, image_size: int = IMAGE_SIZE) -> Path:
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    byte_chars = list(bytes_to_unicode().values())
    vocab = byte_chars + [c + "</w>" for c in byte_chars] + ["<|startoftext|>", "<|endoftext|>"]
    tokenizer = CLIPTokenizer(vocab={tok: i for i, tok in enumerate(vocab)}, merges=[])
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": image_size},
                                           crop_size={"height": image_size, "width": image_size}),
        tokenizer=tokenizer,
    )
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, bos_token_id=len(vocab) - 2,
                         eos_token_id=len(vocab) - 1, pad_token_id=len(vocab) - 1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=image_size, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    model = CLIPModel(config)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(50.0))  # not the init value, so a score that ignores it fails
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def save_tiny_hps(folder: Path, image_size: int = IMAGE_SIZE) -> tuple[Path, Path]:
    """(model config JSON, checkpoint .pt) of a small open_clip model with the real tokenizer's vocabulary."""
    import open_clip

    config = folder / f"{HPS_ARCH}.json"
    config.write_text(json.dumps({
        "embed_dim": 16,
        "vision_cfg": {"image_size": image_size, "layers": 2, "width": 32, "head_width": 8, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
    }))
    open_clip.add_model_config(config)
    torch.manual_seed(1)
    model = open_clip.create_model(HPS_ARCH, pretrained=None, load_weights=False)
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return config, checkpoint


def save_tiny_aesthetic_head(folder: Path) -> Path:
    from recast_cli.rewards.aesthetic import AestheticMLP

    torch.manual_seed(2)
    path = folder / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(AestheticMLP(16).state_dict(), path)
    return path

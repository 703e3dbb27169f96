"""``clip``: CLIP ViT-L/14 image–text score as in Flow-GRPO, logit / 30.

score = exp(logit_scale) · cos(f_img, f_txt) / 30, i.e. CLIP's ``logits_per_image`` diagonal
divided by 30 (with the released logit scale 100 this is 10/3 · cos; range [-10/3, 10/3]
for that checkpoint, unbounded in general).

Preprocessing (Flow-GRPO's ``ClipScorer``): RGB pixels as floats in [0, 1] → torchvision
``Resize`` of the shortest edge to the processor's ``size`` (bilinear, antialiased) →
``CenterCrop`` to its ``crop_size`` → ``Normalize`` with its ``image_mean`` / ``image_std``;
text padded to the context length (77) and truncated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.rewards import hfclip
from recast_cli.rewards.base import (BatchedScorer, check_batch_size, torch_device)
from recast_cli.rewards.weights import WeightSpec, resolve

CLIP_WEIGHTS = WeightSpec("clip", "CLIP ViT-L/14 model folder", "weights", "RECAST_CLIP_PATH",
                          "openai/clip-vit-large-patch14")
LOGIT_DIVISOR = 30.0


class ClipScore(BatchedScorer):
    """exp(logit_scale)·cos(image, text) / 30 with CLIP ViT-L/14 (transformers)."""

    name = "clip"
    float_input = True  # Flow-GRPO's tensor pipeline works on float pixels

    def __init__(self, weights: str | Path | None = None, device: str = "cpu", batch_size: int = 16) -> None:
        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        path = resolve(CLIP_WEIGHTS, weights)
        self.model = hfclip.load_model(self.name, path, self.device)
        self.processor = hfclip.load_processor(self.name, path)
        self.transform = pixel_transform(self.processor.image_processor)
        bound = float(self.model.logit_scale.exp()) / LOGIT_DIVISOR
        self.output_range = (-bound, bound)

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        batch = torch.stack([self.transform(p) for p in images]).to(self.device)
        tokens = hfclip.tokenize(self.processor, self.model, prompts, "max_length", self.device)
        return hfclip.scaled_cosine(self.model, batch, **tokens, divisor=LOGIT_DIVISOR).double().cpu().numpy()


def pixel_transform(image_processor):
    """Flow-GRPO's tensor pipeline built from a CLIP image processor's settings (see module docstring)."""
    from torchvision import transforms as T

    steps = []
    if image_processor.do_resize:
        steps.append(T.Resize(_edge(image_processor.size)))
    if image_processor.do_center_crop:
        steps.append(T.CenterCrop(_edge(image_processor.crop_size)))
    if image_processor.do_normalize:
        steps.append(T.Normalize(mean=image_processor.image_mean, std=image_processor.image_std))
    return T.Compose(steps)


def _edge(size) -> int | tuple[int, int]:
    """An int (shortest edge) or (height, width) from the processor's size field."""
    if isinstance(size, int):
        return size
    size = dict(size)
    if size.get("shortest_edge"):
        return int(size["shortest_edge"])
    return int(size["height"]), int(size["width"])

"""``pick``: PickScore_v1 as in Flow-GRPO, exp(logit_scale) · cos / 26.

score = exp(logit_scale) · cos(f_img, f_txt) / 26 with the PickScore_v1 CLIP model (a
fine-tuned CLIP-ViT-H-14). Dividing by 26 brings typical scores near [0, 1]; the bound is
± exp(logit_scale) / 26 (≈ ±3.8 for the released logit scale 100).

Preprocessing: the CLIP-ViT-H-14 (laion2B-s32B-b79K) ``CLIPProcessor``: its image processor
(bicubic resize of the shortest edge to 224, centre crop 224, rescale 1/255, CLIP mean/std)
on uint8 RGB images; text padded to the longest prompt of the batch, truncated to 77.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.rewards import hfclip
from recast_cli.rewards.base import BatchedScorer, check_batch_size, torch_device
from recast_cli.rewards.weights import WeightSpec, resolve

PICK_WEIGHTS = WeightSpec("pick", "PickScore_v1 model folder", "weights", "RECAST_PICK_PATH",
                          "yuvalkirstain/PickScore_v1")
PICK_PROCESSOR = WeightSpec("pick", "CLIP-ViT-H-14 processor folder", "processor", "RECAST_PICK_PROCESSOR_PATH",
                            "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", folder="processor")
PICK_DIVISOR = 26.0


class PickScore(BatchedScorer):
    """exp(logit_scale)·cos(image, text) / 26 with PickScore_v1."""

    name = "pick"

    def __init__(self, weights: str | Path | None = None, processor: str | Path | None = None,
                 device: str = "cpu", batch_size: int = 16) -> None:
        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        self.model = hfclip.load_model(self.name, resolve(PICK_WEIGHTS, weights), self.device)
        self.processor = hfclip.load_processor(self.name, resolve(PICK_PROCESSOR, processor))
        bound = float(self.model.logit_scale.exp()) / PICK_DIVISOR
        self.output_range = (-bound, bound)

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        pixels = self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        tokens = hfclip.tokenize(self.processor, self.model, prompts, "longest", self.device)
        return hfclip.scaled_cosine(self.model, pixels.to(self.device), **tokens,
                                    divisor=PICK_DIVISOR).double().cpu().numpy()

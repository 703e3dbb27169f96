"""``aesthetic``: the LAION aesthetic predictor v2, an MLP head over normalised CLIP ViT-L/14 image features.

score = MLP(f / ‖f‖), f = CLIP ViT-L/14 projected image embedding; the head is
Linear(d,1024) → Linear(1024,128) → Linear(128,64) → Linear(64,16) → Linear(16,1) with
dropout between and no activation (so the whole head is one affine map: a linear probe).
Trained on a 1–10 rating scale; unbounded in principle.

Preprocessing: the CLIP ViT-L/14 ``CLIPImageProcessor`` (bicubic shortest edge 224, centre
crop 224, rescale, CLIP mean/std) on uint8 RGB images, as in Flow-GRPO's ``AestheticScorer``.
Head weights: ``sac+logos+ava1-l14-linearMSE.pth`` (a plain state dict, read with
``weights_only=True``) or the same tensors as safetensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from recast_cli.errors import BadInput
from recast_cli.rewards import hfclip
from recast_cli.rewards.base import BatchedScorer, check_batch_size, torch_device
from recast_cli.rewards.clip import CLIP_WEIGHTS
from recast_cli.rewards.weights import WeightSpec, resolve

HEAD_WEIGHTS = WeightSpec("aesthetic", "aesthetic MLP head (.pth or .safetensors)", "weights",
                          "RECAST_AESTHETIC_PATH", "trl-lib/ddpo-aesthetic-predictor", "aesthetic-model.pth")
AESTHETIC_CLIP = WeightSpec("aesthetic", "CLIP ViT-L/14 model folder", "clip", "RECAST_CLIP_PATH",
                            CLIP_WEIGHTS.hf_repo)


class AestheticMLP(nn.Module):
    """The LAION improved-aesthetic-predictor head (keys ``layers.{0,2,4,6,7}``)."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class AestheticScore(BatchedScorer):
    """MLP(f/‖f‖) over CLIP ViT-L/14 image features (LAION aesthetic predictor v2)."""

    name = "aesthetic"

    def __init__(self, weights: str | Path | None = None, clip: str | Path | None = None,
                 device: str = "cpu", batch_size: int = 16) -> None:
        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        clip_path = resolve(AESTHETIC_CLIP, clip)
        self.model = hfclip.load_model(self.name, clip_path, self.device)
        self.processor = hfclip.load_processor(self.name, clip_path)
        self.head = load_head(resolve(HEAD_WEIGHTS, weights), self.model.config.projection_dim).to(self.device)

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        pixels = self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        return aesthetic_score(self.model, self.head, pixels.to(self.device)).double().cpu().numpy()


def aesthetic_score(model, head: AestheticMLP, pixel_values: torch.Tensor) -> torch.Tensor:
    """MLP(f/‖f‖) per image [B], f the CLIP model's projected image embedding."""
    f = hfclip.image_features(model, pixel_values)
    return head(f / f.norm(dim=-1, keepdim=True)).squeeze(1)


def load_head(path: Path, input_size: int) -> AestheticMLP:
    """The MLP head from a .safetensors file or a torch state dict (``weights_only=True``: no code runs)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch and safetensors raise many types for a bad file
        raise BadInput(f"aesthetic: cannot read the MLP head {path} ({type(exc).__name__})") from None
    head = AestheticMLP(input_size)
    try:
        head.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise BadInput(f"aesthetic: {path} does not fit the aesthetic MLP on {input_size}-d features ({first})") from None
    return head.eval().requires_grad_(False)

"""``hpsv3``: HPSv3 (a Qwen2-VL-7B preference model) through its published package (``hpsv3``).

score = μ, the mean of the Gaussian preference the model predicts for (image, prompt) (its
logits are (μ, σ); HPSv3 ranks by μ); unbounded.

Preprocessing: the package's ``HPSv3RewardInferencer.prepare_batch`` (images resized to
256·28·28 pixels, its instruction template around the prompt, the Qwen2-VL chat template).

Weights: ``HPSv3.safetensors`` (MizzenAI/HPSv3) and the base model its config names
(Qwen2-VL-7B-Instruct) in the local HF cache. The package pins transformers==4.45.2 (and
deepspeed, trl, ...), so it runs in a separate environment: install hpsv3 there, run
``recast serve-reward hpsv3`` and score with ``hpsv3@http://127.0.0.1:PORT``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.rewards.base import BatchedScorer, check_batch_size, torch_device
from recast_cli.rewards.weights import WeightSpec, resolve

HPSV3_WEIGHTS = WeightSpec("hpsv3", "HPSv3 checkpoint HPSv3.safetensors", "weights", "RECAST_HPSV3_PATH",
                           "MizzenAI/HPSv3", "HPSv3.safetensors")
SEPARATE_PROCESS = ("install hpsv3==1.0.0 (it pins transformers==4.45.2) in a separate environment, run "
                    "`recast serve-reward hpsv3` there and score with hpsv3@http://127.0.0.1:PORT")


class Hpsv3Score(BatchedScorer):
    """μ of HPSv3's predicted preference for (image, prompt)."""

    name = "hpsv3"
    requires = ("hpsv3",)
    fetch_also = (("Qwen/Qwen2-VL-7B-Instruct", "model"),)  # the base model its config names (HPSv3_7B.yaml)
    provided_by = ("`make judges` scores it with its side package set (.side/, built by `make side`); or "
                   + SEPARATE_PROCESS)

    def __init__(self, weights: str | Path | None = None, config: str | Path | None = None, device: str = "cpu",
                 batch_size: int = 4) -> None:
        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        checkpoint = resolve(HPSV3_WEIGHTS, weights)
        try:
            from hpsv3 import HPSv3RewardInferencer
        except Exception as exc:  # ImportError, or a transformers API mismatch at import time
            raise BadInput(f"hpsv3: the hpsv3 package does not import here ({type(exc).__name__}); "
                           f"{SEPARATE_PROCESS}") from None
        try:
            self.inferencer = HPSv3RewardInferencer(config_path=None if config is None else str(config),
                                                    checkpoint_path=str(checkpoint), device=str(self.device))
        except OSError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"hpsv3: cannot load the model ({first}); its base model must be in the local HF cache") from None

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        return self.inferencer.reward(images, prompts)[:, 0].double().cpu().numpy()

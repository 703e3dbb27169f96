"""How close the toy model is to its data: the toy rewards on renderer images and on samples.

``recast toy quality`` prints, for every toy reward, its mean over all 24 prompts x n images
for the renderer (the data, π⁺), the shipped model's samples and a randomly initialised
model of the same architecture. A trained model is good when it sits near the renderer and
far from the random model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.policy.sd3 import SD3Policy
from recast_cli.rewards import build_scorer
from recast_cli.toy import renderer
from recast_cli.toy.model import build_pipeline, save_pipeline
from recast_cli.toy.pretrain import MAX_SEQUENCE_LENGTH, toy_words

TOY_REWARDS = ("toy_color", "toy_shape", "toy_sharpness")


def policy_samples(policy: SD3Policy, prompts: list[str], seed: int, batch: int = 48) -> torch.Tensor:
    """ODE samples (noise level 0), image i seeded by ``seed + i``."""
    images = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        seeds = torch.arange(seed + start, seed + start + len(chunk))
        latents = policy.sample(policy.encode_prompts(chunk), 0.0, seeds, keep_log_probs=False).states[:, -1]
        images.append(policy.decode(latents))
    return torch.cat(images)


def reward_means(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    return {name: float(np.mean(build_scorer(name).score(images, prompts))) for name in TOY_REWARDS}


def quality(model: str | Path, n: int = 4, seed: int = 1000, steps: int = 10, guidance_scale: float = 4.5,
            work: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Mean toy rewards for the renderer, the model at ``model`` and a random-initialised model."""
    prompts = [p for p in renderer.all_prompts() for _ in range(n)]
    seeds = [seed + i for i in range(len(prompts))]
    out = {"renderer": reward_means(renderer.render_batch(prompts, seeds, 32), prompts)}
    random_dir = Path(work or Path(model).parent) / ".random-init-model"
    save_pipeline(build_pipeline(toy_words(), seed=12345), random_dir)
    for label, folder in (("model", Path(model)), ("random init", random_dir)):
        policy = SD3Policy.from_pretrained(folder, steps=steps, guidance_scale=guidance_scale,
                                           max_sequence_length=MAX_SEQUENCE_LENGTH, device="cpu")
        out[label] = reward_means(policy_samples(policy, prompts, seed), prompts)
    return out

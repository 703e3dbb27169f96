"""Shared fixtures: tiny same-architecture models on disk (see ``tiny_models``), test images, an empty HF cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from tests.rewards import tiny_models
from tests.rewards.tiny_models import IMAGE_SIZE


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory) -> Path:
    return tiny_models.save_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


@pytest.fixture(scope="session")
def tiny_hps(tmp_path_factory) -> tuple[Path, Path]:
    """(model config JSON, checkpoint .pt) of a small open_clip model."""
    return tiny_models.save_tiny_hps(tmp_path_factory.mktemp("tiny-hps"))


@pytest.fixture(scope="session")
def tiny_aesthetic_head(tmp_path_factory) -> Path:
    return tiny_models.save_tiny_aesthetic_head(tmp_path_factory.mktemp("aesthetic"))


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    """An empty local HF cache and no weight variables: nothing can be found unless a test puts it there."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    for var in ("RECAST_CLIP_PATH", "RECAST_PICK_PATH", "RECAST_PICK_PROCESSOR_PATH", "RECAST_HPS_PATH",
                "RECAST_AESTHETIC_PATH", "RECAST_IMAGEREWARD_PATH", "RECAST_HPSV3_PATH"):
        monkeypatch.delenv(var, raising=False)
    return cache


def noise_images(count: int, size: int = IMAGE_SIZE, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]


def text_image(text: str, size: tuple[int, int] = (320, 96), font_size: int = 32) -> Image.Image:
    """Black text on white, rendered with Pillow's built-in scalable font."""
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((12, (size[1] - font_size) // 2), text, fill="black",
                               font=ImageFont.load_default(size=font_size))
    return image

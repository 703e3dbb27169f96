"""A tiny trainable toy setting: random-initialised SD3-architecture model, T = 4, small batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_toy_setting

TRAIN_TABLE = """
[train]
rewards = ["toy_color", "toy_shape", "toy_sharpness"]
lambda = [1, 2, 1]
prompts = "toy"
max_steps = 4
group_size = 2
prompts_per_step = 2
micro_batch = 5
sample_batch = 3
learning_rate = 1e-3
clip_range = 0.2
beta_kl = 0.05
lora_rank = 2
lora_alpha = 4
save_every = 2
"""


def tiny_train_setting(root: Path, extra: str = "") -> Path:
    """``root/tiny.toml``: the tiny toy policy (T = 4) plus a [train] table (and ``extra`` keys in it)."""
    path = tiny_toy_setting(root, seed=0, steps=4)
    path.write_text(path.read_text() + TRAIN_TABLE + extra)
    return path


@pytest.fixture(scope="module")
def train_setting(tmp_path_factory) -> Path:
    return tiny_train_setting(tmp_path_factory.mktemp("train"))

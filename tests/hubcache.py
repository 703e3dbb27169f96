"""A local Hugging Face cache laid out by hand, as ``huggingface_hub`` lays it out, for the paper settings'
Hub ids (``stabilityai/stable-diffusion-3.5-medium``, ``xswu/HPSv2``, …) to resolve with no network.

``CACHE/models--OWNER--NAME/refs/main`` holds a commit id and ``snapshots/COMMIT/`` the files: what
``huggingface_hub.try_to_load_from_cache`` (recast_cli/hub.py) reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"

#: every repo the paper settings name besides the policy, and the stand-in files the checks look for
PAPER_REWARD_FILES: dict[str, tuple[str, ...]] = {
    "openai/clip-vit-large-patch14": ("config.json",),
    "yuvalkirstain/PickScore_v1": ("config.json",),
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": ("preprocessor_config.json",),
    "xswu/HPSv2": ("HPS_v2.1_compressed.pt",),
    "trl-lib/ddpo-aesthetic-predictor": ("aesthetic-model.pth",),
    "THUDM/ImageReward": ("ImageReward.pt", "med_config.json"),
    "MizzenAI/HPSv3": ("HPSv3.safetensors",),
}


def snapshot(cache: Path, repo: str, commit: str = COMMIT) -> Path:
    """The snapshot folder of ``repo`` at ``main`` in ``cache`` (made, with its ref, if need be)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    folder = root / "snapshots" / commit
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def put(cache: Path, repo: str, files: tuple[str, ...] = (), write: Callable[[Path], object] | None = None) -> Path:
    """``repo`` in ``cache``: stand-in ``files`` (``{}`` for JSON, bytes otherwise) and/or what ``write`` saves
    into the snapshot folder (a tiny model)."""
    folder = snapshot(cache, repo)
    for name in files:
        (folder / name).write_text("{}") if name.endswith(".json") else (folder / name).write_bytes(b"stand-in")
    if write is not None:
        write(folder)
    return folder


@contextmanager
def using_cache(cache: Path, offline: bool = True) -> Iterator[Path]:
    """``cache`` as the HF cache for this process (huggingface_hub's constant) and its children
    (``HF_HUB_CACHE``; with ``offline``, ``HF_HUB_OFFLINE=1`` for them too)."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        mp.setenv("HF_HUB_CACHE", str(cache))
        if offline:
            mp.setenv("HF_HUB_OFFLINE", "1")
        yield cache


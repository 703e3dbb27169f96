"""``recast sample``: images from a setting's policy (any policy), written as PNGs."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from recast_cli.artifacts import IMAGE_SCHEMA, PNG_SCHEMA_KEY, atomic_write_bytes, claim_folder, refuse_foreign_file
from recast_cli.policy.base import FlowPolicy


def slug(prompt: str, limit: int = 60) -> str:
    """A file-name-safe form of a prompt."""
    return re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:limit] or "prompt"


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """[B, 3, H, W] in [0, 1] → RGB PIL images (rounded to 8 bits)."""
    array = (images.clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)
    return [Image.fromarray(a) for a in array]


def png_bytes(image: Image.Image, notes: Mapping[str, str] | None = None) -> bytes:
    """The PNG of one sampled image, tagged as recast's (a later run may replace it, nothing else), with
    ``notes`` as text chunks (``setting_changes``: what of a run's setting changed since it trained)."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(PNG_SCHEMA_KEY, IMAGE_SCHEMA)
    for key, value in (notes or {}).items():
        info.add_text(key, value)
    buf = io.BytesIO()
    image.save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def image_path(out_dir: Path, prompt: str, seed: int) -> Path:
    return out_dir / f"{slug(prompt)}-{seed:04d}.png"


def check_outputs(prompts: Sequence[str], n: int, out_dir: str | Path, seed: int = 0, grid: bool = False) -> None:
    """Before sampling: ``out_dir`` is not a recast artifact folder (nor inside one), and every PNG
    that would be replaced is one ``recast sample`` wrote (BadInput otherwise)."""
    out_dir = claim_folder(out_dir, None)
    for prompt in prompts:
        for i in range(n):
            refuse_foreign_file(image_path(out_dir, prompt, seed + i), IMAGE_SCHEMA)
    if grid:
        refuse_foreign_file(Path(out_dir) / GRID_NAME, IMAGE_SCHEMA)


#: The one picture of every sample ``recast sample --grid`` writes beside them.
GRID_NAME = "grid.png"


def write_grid(paths: Sequence[Path], n: int, out_dir: str | Path, notes: Mapping[str, str] | None = None) -> Path:
    """The samples tiled, one row per prompt and ``n`` columns (``paths`` prompt-major), as ``OUT/grid.png``."""
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in paths]
    w, h = images[0].size
    rows = len(images) // n
    grid = Image.new("RGB", (n * w, rows * h), (255, 255, 255))
    for k, image in enumerate(images):
        grid.paste(image, ((k % n) * w, (k // n) * h))
    out = Path(out_dir) / GRID_NAME
    atomic_write_bytes(out, png_bytes(grid, notes))
    return out


def sample_images(policy: FlowPolicy, prompts: Sequence[str], n: int, out_dir: str | Path, seed: int = 0,
                  noise_level: float = 0.0, batch: int = 8, notes: Mapping[str, str] | None = None) -> list[Path]:
    """``n`` images per prompt; image i of a prompt uses seed ``seed + i`` (reproducible one by one); ``notes``
    as each PNG's text chunks (:func:`png_bytes`)."""
    out_dir = Path(out_dir)
    jobs = [(p, i) for p in prompts for i in range(n)]
    written = []
    with Progress(TextColumn("sampling"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True)) as progress:
        task = progress.add_task("sample", total=len(jobs))
        for start in range(0, len(jobs), batch):
            chunk = jobs[start : start + batch]
            cond = policy.encode_prompts([p for p, _ in chunk])
            seeds = torch.tensor([seed + i for _, i in chunk])
            latents = policy.sample(cond, noise_level, seeds, keep_log_probs=False).states[:, -1]
            for (prompt, i), image in zip(chunk, to_pil(policy.decode(latents))):
                path = image_path(out_dir, prompt, seed + i)
                atomic_write_bytes(path, png_bytes(image, notes))
                written.append(path)
            progress.update(task, advance=len(chunk))
    return written

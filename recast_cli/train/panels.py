"""The pictures a training run sends to its loggers (``train/loggers``): W as a heatmap, and a grid of
sampled images under their prompts and per-reward scores. Each is an RGB array [H, W, 3] of uint8,
drawn with matplotlib (W) and PIL (the grid): both are dependencies already, imported on first use."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np

#: The images of one sample grid: the first image of each group (one per prompt), at most this many.
GRID_IMAGES = 16
#: A grid tile's smallest side in pixels: small images (the toy model's 32 px) are scaled up, pixel for pixel.
TILE_MIN = 128


def weights_heatmap(W: np.ndarray, rewards: Sequence[str], trained: int) -> np.ndarray:
    """W [m, T] as a reward × step heatmap of T'·W_{i,t} (a static W is λ̂_i on every trained step)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    m, steps = W.shape
    fig = Figure(figsize=(max(4.0, 0.3 * steps + 2.5), 0.45 * m + 1.6), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(np.asarray(W, dtype=np.float64) * trained, aspect="auto", cmap="viridis",
                      interpolation="nearest", extent=(0.5, steps + 0.5, m - 0.5, -0.5))
    ax.set_yticks(range(m), labels=list(rewards))
    ax.set_xlabel("step t (1 = clean, T = noisy)")
    ax.set_title(f"W of this run, × T′ = {trained}")
    fig.colorbar(image, ax=ax, label="T′ · W$_{i,t}$")
    fig.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def grid_picks(count: int, group_size: int) -> list[int]:
    """The indices of the images a grid shows: the first of each group, at most :data:`GRID_IMAGES`."""
    return list(range(0, count, group_size))[:GRID_IMAGES]


def is_image_batch(decoded) -> bool:
    """Whether decoded samples are images [B, 3, H, W] (the 1-D worlds decode to the samples themselves)."""
    return decoded.dim() == 4 and decoded.shape[1] == 3


def sample_grid(images: np.ndarray, prompts: Sequence[str], scores: np.ndarray, rewards: Sequence[str]) -> np.ndarray:
    """Images [n, 3, H, W] in [0, 1] as a grid of tiles, each over its prompt (up to 3 lines) and its
    score under every reward (``scores`` [n, m])."""
    from PIL import Image, ImageDraw, ImageFont

    n, _, h, w = images.shape
    scale = max(1, -(-TILE_MIN // min(h, w)))
    tile_w, tile_h = w * scale, h * scale
    font = ImageFont.load_default()
    char_w = max(1.0, font.getlength("abcdefghij") / 10)
    line_h = 12
    wrap = max(8, int((tile_w - 4) // char_w))
    captions = []
    for prompt, row in zip(prompts, scores):
        lines = textwrap.wrap(prompt, wrap, max_lines=3, placeholder="…") or [""]
        captions.append(lines + [textwrap.shorten(f"{name} {value:.3g}", wrap, placeholder="…")
                                 for name, value in zip(rewards, row)])
    text_h = line_h * max(len(c) for c in captions) + 4
    cols = min(4, n)
    rows = -(-n // cols)
    pad = 4
    canvas = Image.new("RGB", (cols * (tile_w + pad) + pad, rows * (tile_h + text_h + pad) + pad), "white")
    draw = ImageDraw.Draw(canvas)
    pixels = (np.clip(images, 0, 1) * 255).round().astype(np.uint8).transpose(0, 2, 3, 1)
    for k in range(n):
        x = pad + (k % cols) * (tile_w + pad)
        y = pad + (k // cols) * (tile_h + text_h + pad)
        canvas.paste(Image.fromarray(pixels[k]).resize((tile_w, tile_h), Image.Resampling.NEAREST), (x, y))
        for j, line in enumerate(captions[k]):
            draw.text((x + 2, y + tile_h + 2 + j * line_h), line, fill="black", font=font)
    return np.asarray(canvas, dtype=np.uint8).copy()

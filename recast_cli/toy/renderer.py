"""The toy world's procedural renderer: one coloured shape on a plain background.

Prompts follow one grammar, ``a {color} {shape} on a {background} background``, over a
fixed vocabulary (4 colours × 3 shapes × 2 backgrounds = 24 prompts). The renderer is the
toy world's π⁺ "strong generator" (docs/method.md §4, positive samples) and the training data
of the toy model.

Geometry comes from the seed alone: the same seed gives the same position, area, rotation
and colour jitter for every prompt, so images of different prompts are paired. Edges are
anti-aliased by 4× supersampling and a box filter (exact pixel coverage of the polygon).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw

from recast_cli.errors import BadInput, shown

#: colour name → RGB in [0, 255]; well separated so the colour reward can unmix edges.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 215, 25),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}

#: shape area as a fraction of the image area, drawn uniformly per seed
AREA_RANGE = (0.10, 0.22)
#: rotation of squares and triangles in degrees, uniform in ±ROTATION
ROTATION = 15.0
#: per-channel colour jitter of the shape, uniform in ±COLOR_JITTER (0..255 units)
COLOR_JITTER = 10
#: pixels kept free between the shape's circumscribed circle and the image border
MARGIN = 1.5
SUPERSAMPLE = 4
MIN_SIZE = 8

_PROMPT = re.compile(r"^a (\w+) (\w+) on a (\w+) background$")


def vocabulary() -> str:
    """One line listing the grammar and the vocabulary (used in every BadInput message)."""
    return (f"'a {{color}} {{shape}} on a {{background}} background' with color in {'/'.join(COLORS)}, "
            f"shape in {'/'.join(SHAPES)}, background in {'/'.join(BACKGROUNDS)}")


def all_prompts() -> list[str]:
    """Every prompt of the toy vocabulary, in a fixed order (colour, then shape, then background)."""
    return [f"a {c} {s} on a {b} background" for c in COLORS for s in SHAPES for b in BACKGROUNDS]


def parse_prompt(prompt: str) -> tuple[str, str, str]:
    """``(color, shape, background)`` of a toy prompt; BadInput naming the vocabulary otherwise."""
    match = _PROMPT.match(" ".join(str(prompt).strip().lower().split()))
    if match is None or match[1] not in COLORS or match[2] not in SHAPES or match[3] not in BACKGROUNDS:
        raise BadInput(f"prompt {shown(prompt)} is outside the toy vocabulary: expected {vocabulary()}")
    return match[1], match[2], match[3]


def shape_polygon(shape: str, cx: float, cy: float, area: float, angle: float) -> list[tuple[float, float]] | None:
    """Vertices of a square or an apex-up equilateral triangle of the given area (None for a circle).

    The triangle's centre is its centroid (= circumcentre); ``angle`` in radians, counter-clockwise
    on screen. Coordinates in pixels with y pointing down.
    """
    if shape == "circle":
        return None
    if shape == "square":
        radius = math.sqrt(area / 2.0)  # half-diagonal
        start = math.pi / 4
        count = 4
    else:
        side = math.sqrt(4.0 * area / math.sqrt(3.0))
        radius = side / math.sqrt(3.0)  # circumradius
        start = math.pi / 2  # apex up
        count = 3
    return [(cx + radius * math.cos(start + angle + 2 * math.pi * k / count),
             cy - radius * math.sin(start + angle + 2 * math.pi * k / count)) for k in range(count)]


def circumradius(shape: str, area: float) -> float:
    """Radius of the smallest centred circle holding the shape (keeps the border background)."""
    if shape == "circle":
        return math.sqrt(area / math.pi)
    if shape == "square":
        return math.sqrt(area / 2.0)
    return math.sqrt(4.0 * area / math.sqrt(3.0)) / math.sqrt(3.0)


def _geometry(seed: int) -> tuple[float, float, float, float, np.ndarray]:
    """Area fraction, centre (fractions in [0, 1]), rotation and colour jitter drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    area = rng.uniform(*AREA_RANGE)
    u, v = rng.uniform(0.0, 1.0, size=2)
    angle = math.radians(rng.uniform(-ROTATION, ROTATION))
    jitter = rng.integers(-COLOR_JITTER, COLOR_JITTER + 1, size=3)
    return area, u, v, angle, jitter


def coverage(shape: str, seed: int, size: int) -> np.ndarray:
    """Anti-aliased coverage mask of the seed's shape, float32 [size, size] in [0, 1]."""
    area_frac, u, v, angle, _ = _geometry(seed)
    area = area_frac * size * size
    reach = circumradius(shape, area) + MARGIN
    # The centre is placed so the circumscribed circle (plus margin) stays inside the image.
    cx = reach + u * (size - 2 * reach)
    cy = reach + v * (size - 2 * reach)
    k = SUPERSAMPLE
    canvas = Image.new("L", (size * k, size * k), 0)
    draw = ImageDraw.Draw(canvas)
    polygon = shape_polygon(shape, cx * k, cy * k, area * k * k, angle)
    if polygon is None:
        r = math.sqrt(area / math.pi) * k
        draw.ellipse((cx * k - r, cy * k - r, cx * k + r, cy * k + r), fill=255)
    else:
        draw.polygon(polygon, fill=255)
    # Box-filter downsampling turns the k×k binary subpixels into a coverage fraction.
    small = canvas.resize((size, size), Image.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _render_array(prompt: str, seed: int, size: int) -> np.ndarray:
    """uint8 [size, size, 3] image of ``prompt`` for ``seed``."""
    if not isinstance(size, (int, np.integer)) or size < MIN_SIZE:
        raise BadInput(f"toy image size must be an integer >= {MIN_SIZE}, got {size!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BadInput(f"toy render seed must be a non-negative integer, got {seed!r}")
    color, shape, background = parse_prompt(prompt)
    mask = coverage(shape, int(seed), int(size))[..., None]
    jitter = _geometry(int(seed))[4]
    fg = np.clip(np.array(COLORS[color]) + jitter, 0, 255).astype(np.float32)
    bg = np.array(BACKGROUNDS[background], dtype=np.float32)
    return np.round(bg + mask * (fg - bg)).astype(np.uint8)


def render(prompt: str, seed: int, size: int = 32) -> Image.Image:
    """The toy image of ``prompt``: RGB, ``size``×``size``, a deterministic function of (prompt, seed, size)."""
    return Image.fromarray(_render_array(prompt, seed, size), mode="RGB")


def render_batch(prompts: Sequence[str], seeds: Sequence[int], size: int = 32) -> torch.Tensor:
    """Float32 [B, 3, size, size] in [0, 1]: the same pixels as ``render`` (training batches)."""
    if len(prompts) != len(seeds):
        raise BadInput(f"render_batch needs one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds")
    if not len(prompts):
        return torch.empty((0, 3, size, size), dtype=torch.float32)
    arrays = np.stack([_render_array(p, int(s), size) for p, s in zip(prompts, seeds)])
    return torch.from_numpy(arrays).permute(0, 3, 1, 2).contiguous().float().div_(255.0)

"""Toy rewards with known timing: colour (coarse), shape (mid), sharpness (fine).

Each reward sees only pixels and the prompt, is deterministic, vectorised over the batch
with numpy, and lies in [0, 1]. They are written so that the denoising steps deciding them
are known in advance, which is what the toy world tests ReCAST's gain curves (E4, E5) with:

* ``toy_color`` depends on the mean colour of the foreground: low frequencies, settled at
  the noisiest steps;
* ``toy_shape`` depends on the outline at the scale of the shape: mid frequencies;
* ``toy_sharpness`` depends on the width of the edges, one pixel: the highest frequencies,
  settled only at the last, clean steps.

Shared preprocessing of an RGB image x ∈ [0, 1]^{H×W×3}: the background colour b is the
per-channel median of the border pixels (the renderer keeps the border free), the
foreground distance is ``d(p) = ‖x(p) − b‖₂`` and the foreground contrast is
``C = max(q₀.₉₇(d), C_MIN)`` (the 97th percentile: fully covered pixels of a shape that
covers ≥ 3% of the image). Formulas are in each class and in ``docs/toy.md``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from recast_cli.rewards.base import Images, Scorer, check_batch, chunks
from recast_cli.toy.renderer import COLORS, SHAPES, parse_prompt

PALETTE = np.array([COLORS[c] for c in COLORS], dtype=np.float32) / 255.0
#: floor of the foreground contrast C, so a blank image is not amplified into a shape
C_MIN = 0.1
#: images processed at once (bounds the [chunk, H, W, 4] working arrays)
CHUNK = 256


def images_to_array(images: Sequence[Image.Image]) -> np.ndarray:
    """Float32 [B, H, W, 3] in [0, 1] from same-sized PIL images."""
    return np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) for im in images]) / 255.0


def background(x: np.ndarray) -> np.ndarray:
    """Per-image background colour [B, 3]: the channel-wise median of the border pixels."""
    border = np.concatenate([x[:, 0], x[:, -1], x[:, 1:-1, 0], x[:, 1:-1, -1]], axis=1)
    return np.median(border, axis=1)


def foreground_distance(x: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """d(p) = ‖x(p) − b‖₂ per pixel, [B, H, W]."""
    return np.linalg.norm(x - bg[:, None, None, :], axis=-1)


def contrast(dist: np.ndarray) -> np.ndarray:
    """Foreground contrast C = max(q₀.₉₇(d), C_MIN) per image, [B]."""
    return np.maximum(np.quantile(dist.reshape(len(dist), -1), 0.97, axis=1), C_MIN)


class _ToyScorer(Scorer):
    """Groups a batch by image size, parses the prompts once, and scores each group vectorised."""

    output_range = (0.0, 1.0)

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        count = check_batch(self.name, images, prompts)
        parsed = [parse_prompt(p) for p in prompts]
        out = np.zeros(count, dtype=np.float64)
        if isinstance(images, torch.Tensor):
            pixels = images.detach().to("cpu", torch.float32).clamp(0, 1).permute(0, 2, 3, 1).numpy()
            for part in chunks(count, CHUNK):
                out[part] = self.score_array(pixels[part], parsed[part])
            return out
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, im in enumerate(images):
            groups[im.size].append(i)
        for index in groups.values():
            for part in chunks(len(index), CHUNK):
                which = index[part]
                out[which] = self.score_array(images_to_array([images[i] for i in which]), [parsed[i] for i in which])
        return out

    @abstractmethod
    def score_array(self, x: np.ndarray, parsed: list[tuple[str, str, str]]) -> np.ndarray:
        """Scores of float32 [B, H, W, 3] images in [0, 1] against parsed prompts."""


class ToyColor(_ToyScorer):
    """Agreement of the dominant foreground colour with the prompt's colour (coarse).

    Each pixel is explained as a blend of the background b and each palette colour c_k:
    ``a_k = clip(⟨x − b, c_k − b⟩ / ‖c_k − b‖², 0, 1)``, residual
    ``ρ_k = ‖x − b − a_k (c_k − b)‖²`` (so anti-aliased and blurred edge pixels still
    count for their colour), and ``p_k = softmax_k(−ρ_k / (2τ²))`` with τ = 0.1. The score is
    the foreground-weighted share of the prompt's colour c,
    ``Σ_p w(p)·p_c(p) / max(Σ_p w(p), W_MIN·H·W)``, ``w = d²`` (saturated pixels dominate;
    background noise barely counts), ``W_MIN = 0.01`` (an image with less foreground
    than 1% of its pixels at full contrast scores proportionally less). Range [0, 1].
    """

    name = "toy_color"
    tau = 0.1
    w_min = 0.01

    def score_array(self, x: np.ndarray, parsed: list[tuple[str, str, str]]) -> np.ndarray:
        bg = background(x)
        rel = x - bg[:, None, None, :]                                   # [B, H, W, 3]
        axis = PALETTE[None, :, :] - bg[:, None, :]                      # [B, K, 3]
        norm2 = np.maximum((axis**2).sum(-1), 1e-6)[:, None, None, :]    # [B, 1, 1, K]
        dot = rel @ axis.transpose(0, 2, 1)[:, None]                     # ⟨x − b, c_k − b⟩
        a = np.clip(dot / norm2, 0.0, 1.0)
        w = (rel**2).sum(-1)
        # ‖rel − a·axis‖² expanded, so no [B, H, W, K, 3] array is formed.
        resid = w[..., None] - 2 * a * dot + a**2 * norm2
        logits = -resid / (2 * self.tau**2)
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)                               # [B, H, W, K]
        wanted = np.array([list(COLORS).index(c) for c, _, _ in parsed])
        p_c = np.take_along_axis(p, wanted[:, None, None, None], axis=-1)[..., 0]
        h, wd = x.shape[1:3]
        return (w * p_c).sum((1, 2)) / np.maximum(w.sum((1, 2)), self.w_min * h * wd)


def _template_sd(shape: str, dx: np.ndarray, dy: np.ndarray, area: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """Signed distance (pixels, > 0 outside) to a shape of the given area and rotation, [B, P].

    ``dx, dy`` [B, P] pixel offsets from the shape's centre (y down); ``area``, ``angle`` [B]
    (the template is the unrotated shape rotated by ``angle``, radians).
    """
    if shape == "circle":
        return np.sqrt(dx**2 + dy**2) - np.sqrt(area / np.pi)[:, None]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    qx = cos * dx + sin * dy  # offsets in the template's own frame
    qy = -sin * dx + cos * dy
    if shape == "square":
        return np.maximum(np.abs(qx), np.abs(qy)) - (np.sqrt(area) / 2)[:, None]
    # Apex-up equilateral triangle: the largest signed distance to its three edge lines.
    inradius = np.sqrt(4 * area / np.sqrt(3)) / (2 * np.sqrt(3))
    normals = [(np.cos(phi), np.sin(phi)) for phi in np.pi / 2 + 2 * np.pi * np.arange(3) / 3]
    return np.maximum.reduce([nx * qx + ny * qy for nx, ny in normals]) - inradius[:, None]


class ToyShape(_ToyScorer):
    """Shape agreement by template matching against the three shapes (mid).

    Soft foreground mask ``m = clip(d / C, 0, 1)`` with area ``A = Σ m``, centroid ĉ and
    offsets ``z = (x − ĉ_x) + i·(y − ĉ_y)``. For each shape s, a template of area A centred
    at ĉ, rotated to the mask's orientation of the shape's symmetry order n (4 for the
    square, 3 for the triangle: ``θ = (arg Σ m·zⁿ − arg S₀)/n``, S₀ the moment of the
    unrotated template) and anti-aliased as the coverage ``clip(½ − sd, 0, 1)`` of its
    signed distance sd, gives the soft IoU ``IoU_s = Σ min(m, T_s) / Σ max(m, T_s)``.
    With s* the prompted shape,
    ``score = IoU_{s*} · sigmoid((IoU_{s*} − max_{s ≠ s*} IoU_s) / τ)``, τ = 0.02: high
    only when the outline fits the prompted shape well *and* better than the other two
    (equal-area templates of different shapes overlap by IoU ≈ 0.7–0.85). An image with
    less than 1 pixel of foreground scores 0. Range [0, 1].
    """

    name = "toy_shape"
    tau = 0.02
    #: rotational symmetry order used to find each template's angle (0: none needed)
    order = {"circle": 0, "square": 4, "triangle": 3}

    def __init__(self) -> None:
        # Phase of Σ T·zⁿ for each unrotated template: the reference the mask's phase is measured from.
        grid = np.mgrid[0:256, 0:256].astype(np.float64) + 0.5 - 128.0
        dy, dx = grid[0].reshape(1, -1), grid[1].reshape(1, -1)
        self.phase0 = {}
        for shape, n in self.order.items():
            if n:
                sd = _template_sd(shape, dx, dy, np.array([5000.0]), np.zeros(1))[0]
                moment = (np.clip(0.5 - sd, 0, 1) * (dx + 1j * dy) ** n).sum()
                self.phase0[shape] = float(np.angle(moment))

    def iou(self, x: np.ndarray) -> np.ndarray:
        """Soft IoU of each image's mask with the aligned equal-area template of each shape, [B, 3]."""
        bsz, h, w = x.shape[:3]
        dist = foreground_distance(x, background(x))
        mask = np.clip(dist / contrast(dist)[:, None, None], 0.0, 1.0).reshape(bsz, -1)
        area = mask.sum(1)
        ys, xs = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5  # pixel centres
        xs, ys = xs.reshape(-1), ys.reshape(-1)
        safe = np.maximum(area, 1e-6)
        dx = xs[None, :] - ((mask * xs).sum(1) / safe)[:, None]
        dy = ys[None, :] - ((mask * ys).sum(1) / safe)[:, None]
        z = dx + 1j * dy
        out = np.zeros((bsz, len(SHAPES)))
        for j, shape in enumerate(SHAPES):
            n = self.order[shape]
            angle = np.zeros(bsz)
            if n:
                angle = (np.angle((mask * z**n).sum(1)) - self.phase0[shape]) / n
            template = np.clip(0.5 - _template_sd(shape, dx, dy, area, angle), 0.0, 1.0)
            out[:, j] = np.minimum(mask, template).sum(-1) / np.maximum(np.maximum(mask, template).sum(-1), 1e-6)
        return np.where(area >= 1.0, out.T, 0.0).T

    def score_array(self, x: np.ndarray, parsed: list[tuple[str, str, str]]) -> np.ndarray:
        iou = self.iou(x)
        wanted = np.array([SHAPES.index(s) for _, s, _ in parsed])
        own = iou[np.arange(len(iou)), wanted]
        others = iou.copy()
        others[np.arange(len(iou)), wanted] = -np.inf
        margin = own - others.max(axis=1)
        return own / (1.0 + np.exp(-margin / self.tau))


class ToySharpness(_ToyScorer):
    """Edge crispness: the inverse effective edge width, in [0, 1] (fine).

    With forward differences ``g = ‖x(p + e) − x(p)‖₂`` over both axes e, an edge of
    contrast C spread over w pixels gives ``Σ g² / Σ g ≈ C / w``. The score is
    ``clip((Σ g² / Σ g) / (κ·C), 0, 1)`` with ``κ = 2/3``: the mean of ``Σ g² / Σ g / C``
    over sub-pixel offsets of an ideal box-filtered straight step, so an ideally
    anti-aliased axis-aligned edge scores ≈ 1 (renderer images: ≈ 0.88, curved and
    slanted edges spread a little) and a Gaussian blur of width σ px roughly
    1/(2√π·σ·κ) for σ ≳ 1. The prompt is not used (beyond validation); a flat image
    (Σ g = 0) scores 0. Like any high-frequency measure it also rewards pixel noise (pure
    noise scores ≈ 1): in the toy world it is meant to be read together with the shape
    and colour rewards. Range [0, 1].
    """

    name = "toy_sharpness"
    kappa = 2.0 / 3.0

    def score_array(self, x: np.ndarray, parsed: list[tuple[str, str, str]]) -> np.ndarray:
        c = contrast(foreground_distance(x, background(x)))
        gx = np.linalg.norm(np.diff(x, axis=2), axis=-1).reshape(len(x), -1)
        gy = np.linalg.norm(np.diff(x, axis=1), axis=-1).reshape(len(x), -1)
        g = np.concatenate([gx, gy], axis=1)
        total = g.sum(1)
        ratio = (g**2).sum(1) / np.maximum(total, 1e-12)
        return np.where(total > 0, np.clip(ratio / (self.kappa * c), 0.0, 1.0), 0.0)

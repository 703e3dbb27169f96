"""The scorer interface every reward and judge implements, and the input checks they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Union

import numpy as np
import torch
from PIL import Image

from recast_cli import bounds
from recast_cli.errors import BadInput

#: A batch of images: PIL images, or a float tensor [B, 3, H, W] with values in [0, 1].
Images = Union[Sequence[Image.Image], torch.Tensor]


class Scorer(ABC):
    """Scores images against their prompts, batched, without gradients.

    ``score`` returns float64 [B], one score per (image, prompt) pair, higher is better.
    Subclasses document their formula and set ``output_range`` (the closed interval the
    scores lie in; ``(-inf, inf)`` when unbounded). ``check_prompts`` rejects unusable
    prompts up front; ``extras`` gives per-image side columns of the last call; ``close``
    frees what the scorer holds (models, connections); scoring after ``close`` is not supported.
    """

    name: str = ""
    output_range: tuple[float, float] = (float("-inf"), float("inf"))
    #: Python packages the scorer imports when it is built: ``recast check-setting`` imports each (in a
    #: process of its own) and, for one that does not import, prints ``provided_by`` (what provides it).
    requires: tuple[str, ...] = ()
    provided_by: str = ""
    #: Hub repos the scorer's own package or server loads from the HF cache besides its weights, as (repo id,
    #: what it reads: ``model`` or ``processor``, recast_cli/fetch/select.py): ``recast fetch`` fetches them.
    fetch_also: tuple[tuple[str, str], ...] = ()

    @abstractmethod
    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        """float64 [len(images)]; ``prompts`` has the same length as ``images``."""

    def check_prompts(self, prompts: Sequence[str]) -> None:
        """Raise BadInput for a prompt this scorer cannot score, before any image is scored."""

    def extras(self) -> dict[str, list]:
        """Scorer-specific columns for the images of the last ``score`` call (e.g. the OCR text)."""
        return {}

    def close(self) -> None:
        """Release models or connections; the default holds nothing that needs it."""

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



class BatchedScorer(Scorer):
    """A scorer whose model scores ``batch_size`` images at a time: the chunking lives here once.

    Subclasses implement ``score_chunk`` on RGB PIL images (or, with ``float_input``, on
    float tensors [3, H, W] in [0, 1]) and set ``self.batch_size``.
    """

    batch_size: int = 16
    float_input: bool = False

    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        count = check_batch(self.name, images, prompts)
        inputs = as_float(images) if self.float_input else as_pil(images)
        out = np.empty(count, dtype=np.float64)
        for part in chunks(count, self.batch_size):
            out[part] = self.score_chunk(inputs[part], list(prompts[part]))
        return out

    @abstractmethod
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        """Scores of one chunk (at most ``batch_size`` images)."""

def check_batch(name: str, images: Images, prompts: Sequence[str]) -> int:
    """The batch size B, after checking that images and prompts pair up one to one."""
    if isinstance(images, torch.Tensor):
        if images.ndim != 4 or images.shape[1] != 3 or not images.is_floating_point():
            raise BadInput(f"{name}: an image tensor must be float [B, 3, H, W], got {images.dtype} "
                           f"{list(images.shape)}")
        count = int(images.shape[0])
    else:
        count = len(images)
    if isinstance(prompts, str):
        raise BadInput(f"{name}: prompts must be a sequence of strings, one per image, not one string")
    if count != len(prompts):
        raise BadInput(f"{name}: {count} images but {len(prompts)} prompts")
    return count


def as_pil(images: Images) -> list[Image.Image]:
    """RGB PIL images; a float tensor in [0, 1] is rounded to uint8 (x·255) first."""
    if isinstance(images, torch.Tensor):
        pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        return [Image.fromarray(p.permute(1, 2, 0).cpu().numpy()) for p in pixels]
    return [im if im.mode == "RGB" else im.convert("RGB") for im in images]


def as_float(images: Images) -> list[torch.Tensor]:
    """Float tensors [3, H, W] in [0, 1] (uint8 / 255 for PIL images), one per image."""
    if isinstance(images, torch.Tensor):
        return list(images.detach().float())
    return [torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255.0 for im in as_pil(images)]


def chunks(count: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` items covering range(count)."""
    for start in range(0, count, size):
        yield slice(start, min(start + size, count))


def check_batch_size(name: str, batch_size: int) -> int:
    """A scorer's ``batch_size`` option, within the bounds of every batch size (``recast_cli.bounds``)."""
    return bounds.check("batch", batch_size, f"{name}: batch_size")


def torch_device(name: str, device: str | torch.device) -> torch.device:
    """The torch device named by ``device``; BadInput when it is malformed or absent."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise BadInput(f"{name}: {device!r} is not a torch device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"{name}: device {device!r} asked for but CUDA is not available")
    return dev

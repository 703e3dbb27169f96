"""The scorer interface every reward and judge implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
from PIL import Image


class Scorer(ABC):
    """Scores images against their prompts, batched, without gradients.

    ``score`` returns float64 [B], one score per (image, prompt) pair, higher is better.
    Subclasses document their formula and set ``output_range`` (the closed interval the
    scores lie in; ``(-inf, inf)`` when unbounded).
    """

    name: str = ""
    output_range: tuple[float, float] = (float("-inf"), float("inf"))

    @abstractmethod
    def score(self, images: Sequence[Image.Image], prompts: Sequence[str]) -> np.ndarray:
        """float64 [len(images)]; ``prompts`` has the same length as ``images``."""

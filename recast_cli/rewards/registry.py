"""One registry of scorer names: name → "module:Class", imported only when built.

Lazy imports keep heavy stacks (open_clip, OCR runtimes, HTTP clients) out of commands
that do not use them.
"""

from __future__ import annotations

import importlib
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Scorer

SCORERS: dict[str, str] = {
    "toy_color": "recast_cli.toy.rewards:ToyColor",
    "toy_shape": "recast_cli.toy.rewards:ToyShape",
    "toy_sharpness": "recast_cli.toy.rewards:ToySharpness",
}


def scorer_names() -> tuple[str, ...]:
    return tuple(SCORERS)


def build_scorer(name: str, **options: Any) -> Scorer:
    """Instantiate the scorer registered as ``name`` with its options (paths, device, ...)."""
    if name not in SCORERS:
        raise BadInput(f"unknown scorer {name!r}; known: {', '.join(SCORERS)}")
    module_name, class_name = SCORERS[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**options)

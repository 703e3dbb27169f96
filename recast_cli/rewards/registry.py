"""One registry of scorer names: name → "module:Class", imported only when built.

Lazy imports keep heavy stacks (open_clip, OCR runtimes, HTTP clients) out of commands
that do not use them.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Scorer

SCORERS: dict[str, str] = {
    "clip": "recast_cli.rewards.clip:ClipScore",
    "hps": "recast_cli.rewards.hps:HpsScore",
    "pick": "recast_cli.rewards.pick:PickScore",
    "ocr": "recast_cli.rewards.ocr:OcrScore",
    "geneval": "recast_cli.rewards.geneval:GenEvalScore",
    "aesthetic": "recast_cli.rewards.aesthetic:AestheticScore",
    "imagereward": "recast_cli.rewards.imagereward:ImageRewardScore",
    "hpsv3": "recast_cli.rewards.hpsv3:Hpsv3Score",
    "unifiedreward": "recast_cli.rewards.unifiedreward:UnifiedRewardScore",
    "remote": "recast_cli.rewards.remote:RemoteScorer",
    "toy_color": "recast_cli.toy.rewards:ToyColor",
    "toy_shape": "recast_cli.toy.rewards:ToyShape",
    "toy_sharpness": "recast_cli.toy.rewards:ToySharpness",
    "coarse": "recast_cli.policy.gmm1d:Coarse",
    "mid": "recast_cli.policy.gmm1d:Mid",
    "fine": "recast_cli.policy.gmm1d:Fine",
    "fine_wide": "recast_cli.policy.gmm1d:FineWide",
}


def scorer_names() -> tuple[str, ...]:
    return tuple(SCORERS)


def scorer_class(name: str) -> type[Scorer]:
    """The class registered as ``name`` (``NAME@URL`` is the remote client); BadInput if unknown."""
    base = name.split("@", 1)[0]
    if base not in SCORERS:
        raise BadInput(f"unknown scorer {base!r}; known: {', '.join(SCORERS)}")
    module_name, class_name = SCORERS["remote" if "@" in name else base].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_scorer(name: str, **options: Any) -> Scorer:
    """Instantiate the scorer registered as ``name`` with its options (paths, device, ...).

    ``NAME@URL`` builds the client of a ``recast serve-reward NAME`` server at URL instead,
    which checks that the server serves NAME.
    """
    cls = scorer_class(name)
    if "@" in name:
        base, url = name.split("@", 1)
        options = {**options, "url": url, "name": base}
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            raise BadInput(f"{name}: unknown option {', '.join(unknown)}; it takes {', '.join(params) or 'none'}")
    missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty and k not in options
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise BadInput(f"{name}: needs option {', '.join(missing)} (e.g. --opt {name}.{missing[0]}=VALUE)")
    return cls(**options)

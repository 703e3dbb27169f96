"""Rewards and judges behind one registry (``registry.SCORERS`` owns every scorer name).

The names below are imported on first use, so importing this package (as ``recast --help``
does through the reward commands) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SCORERS", "Scorer", "build_scorer", "scorer_class", "scorer_names"]
_WHERE = {"Scorer": "recast_cli.rewards.base", "SCORERS": "recast_cli.rewards.registry",
          "build_scorer": "recast_cli.rewards.registry", "scorer_class": "recast_cli.rewards.registry",
          "scorer_names": "recast_cli.rewards.registry"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Rewards and judges behind one registry (``registry.SCORERS`` owns every scorer name)."""

from recast_cli.rewards.base import Scorer
from recast_cli.rewards.registry import SCORERS, build_scorer, scorer_class, scorer_names

__all__ = ["SCORERS", "Scorer", "build_scorer", "scorer_class", "scorer_names"]

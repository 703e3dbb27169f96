"""A setting's ``[rewards.NAME]`` tables: the constructor options of scorer NAME, paths made absolute.

Paths are relative to the setting file, so a setting folder can be moved as a whole. Which
options are paths is read from the scorer's module (its ``WeightSpec``s) without building it.
A weight option that names no existing path but reads as a Hub repo id (``owner/name[@revision]``)
stays as written: the scorer resolves it from the local HF cache (recast_cli/hub.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.hub import hub_id_of
from recast_cli.rewards.weights import WeightSpec

#: Scorer options that name a file but have no WeightSpec (those are found in the scorer's module).
EXTRA_PATH_OPTIONS = {"geneval": ("metadata",), "hpsv3": ("config",)}
#: Options that hold a model name or, ending in .json, a config file path.
CONFIG_OR_NAME_OPTIONS = {"hps": ("arch",)}


def weight_specs(name: str) -> list[WeightSpec]:
    """The ``WeightSpec``s of scorer ``name``: the weights it resolves (found in its module)."""
    from recast_cli.rewards.registry import scorer_class  # the registry imports torch

    module = importlib.import_module(scorer_class(name).__module__)
    return [v for v in vars(module).values() if isinstance(v, WeightSpec) and v.scorer == name]


def reward_path_options(name: str) -> frozenset[str]:
    """Options of scorer ``name`` that hold paths (resolved relative to the setting file)."""
    return frozenset({s.option for s in weight_specs(name)} | set(EXTRA_PATH_OPTIONS.get(name, ())))


def resolve_reward_options(name: str, options: dict[str, Any], base: Path) -> dict[str, Any]:
    """``options`` with every relative path option made absolute against ``base`` (the setting's folder)."""
    paths = reward_path_options(name) if "@" not in name else frozenset()
    # options that name a model or a JSON config file (hps `arch`): a path when it ends in .json
    paths |= {k for k, v in options.items() if k in CONFIG_OR_NAME_OPTIONS.get(name.split("@")[0], ())
              and isinstance(v, str) and v.endswith(".json")}
    hub_options = {s.option for s in weight_specs(name)} if "@" not in name else set()

    def resolved(key: str, value: Any) -> Any:
        if not ((key in paths or key.endswith("path")) and isinstance(value, str)):
            return value
        if key in hub_options and hub_id_of(value, base) is not None:
            return value  # a repo id: the scorer finds it in the cache
        return str((base / Path(value).expanduser()).resolve())

    return {k: resolved(k, v) for k, v in options.items()}


def reward_options(raw: dict[str, Any], setting_file: Path) -> dict[str, dict[str, Any]]:
    """The ``[rewards.NAME]`` tables of a setting's TOML ``raw``, each resolved against its folder."""
    tables = raw.get("rewards", {})
    if not isinstance(tables, dict) or not all(isinstance(v, dict) for v in tables.values()):
        raise BadInput(f"{setting_file}: [rewards.NAME] tables must hold the options of reward NAME")
    return {name: resolve_reward_options(name, opts, setting_file.parent) for name, opts in tables.items()}

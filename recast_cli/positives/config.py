"""The ``[positives]`` table of a setting: the prompts π⁺ images are made for, and (``--source
self``) the rewards that get one positive set each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recast_cli.errors import BadInput, refuse_duplicates
from recast_cli.setting.load import Setting, parse_table


@dataclass(frozen=True)
class PositivesConfig:
    """``prompts``: the prompts file, relative to the setting file's folder (None: not given);
    ``rewards``: scorer names (empty: not given)."""

    prompts: Path | None = None
    rewards: tuple[str, ...] = ()


def config_from_setting(setting: Setting) -> PositivesConfig:
    """The table, its types checked (``check-setting`` also checks the names and the file)."""
    table = setting.raw.get("positives", {})
    if not isinstance(table, dict):
        raise BadInput(f"{setting.file}: [positives] must be a table")
    where = f"{setting.file} [positives]"

    def prompts(value: Any) -> Path:
        if not isinstance(value, str) or not value:
            raise BadInput(f"{where}: prompts must be a file name, got {value!r}")
        return setting.file.parent / value

    def rewards(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise BadInput(f"{where}: rewards must be a list of registered scorer names, got {value!r}")
        refuse_duplicates(value, f"{where}: rewards")
        return tuple(value)

    def unknown(keys: list[str], allowed: list[str]) -> str:
        return f"{where}: unknown key {', '.join(sorted(keys))}; allowed: {', '.join(allowed)}"

    return parse_table(PositivesConfig, table, unknown, {"prompts": prompts, "rewards": rewards})

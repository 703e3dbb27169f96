"""The ``[evaluate]`` table of a setting: held-out prompts, n, seed, steps, CFG, judges, batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recast_cli import bounds
from recast_cli.errors import BadInput, refuse_duplicates
from recast_cli.setting.load import Setting, parse_table
from recast_cli.train.config import TrainConfig, config_from_setting as train_config


@dataclass(frozen=True)
class EvalConfig:
    """The ``[evaluate]`` table after flags: what is sampled and who scores it.

    ``steps`` and ``guidance_scale`` None mean the setting's ``[policy]`` values.
    """

    prompts: str
    n: int = 4
    seed: int = 10000
    steps: int | None = None
    guidance_scale: float | None = None
    judges: tuple[str, ...] = ()
    batch_size: int = 16


def config_from_setting(setting: Setting) -> tuple[EvalConfig, TrainConfig]:
    """(the ``[evaluate]`` table with its defaults, the setting's [train] config).

    Without an ``[evaluate]`` table: the ``[train]`` prompts, n = 4, seed = 10000, the policy's
    steps and CFG, no judges. Paths are relative to the setting file, as in ``[train]``.
    """
    where = f"{setting.file} [evaluate]"
    # a setting without [train] still has [rewards.NAME] options (judges) to resolve the same way
    train = train_config(setting, required=False)
    table = setting.raw.get("evaluate", {})
    if not isinstance(table, dict):
        raise BadInput(f"{setting.file}: [evaluate] must be a table")

    def prompts(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise BadInput(f"{where}: prompts must be 'toy' or a prompt file")
        return value if value == "toy" else str((setting.file.parent / value).resolve())

    def train_prompts() -> str:
        if not train.prompts:
            raise BadInput(f"{setting.file}: no prompts to evaluate on (set [evaluate] prompts, or [train] prompts)")
        return train.prompts

    def judges(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(j, str) for j in value):
            raise BadInput(f"{where}: judges must be a list of scorer names")
        refuse_duplicates(value, f"{where}: judges")
        return tuple(value)

    def guidance_scale(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise BadInput(f"{where}: guidance_scale must be a number >= 0, got {value!r}")
        return float(value)

    def unknown(keys: list[str], allowed: list[str]) -> str:
        return f"{where}: unknown key {sorted(keys)[0]!r}; allowed: {', '.join(allowed)}"

    parse = {"prompts": prompts, "judges": judges,
             **{key: (lambda v, key=key, kind=kind: bounds.check(kind, v, f"{where}: {key}"))
                for key, kind in (("n", "images_per_prompt"), ("seed", "seed"), ("steps", "steps"),
                                  ("batch_size", "batch"))},
             "guidance_scale": guidance_scale}
    return parse_table(EvalConfig, table, unknown, parse, absent={"prompts": train_prompts}), train

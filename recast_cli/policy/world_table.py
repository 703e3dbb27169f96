"""The ``[world]`` table of a setting → a :class:`~recast_cli.policy.world1d.World1D` (issue 33 §2).

The four reward forms (explicit edges, a threshold, intervals, periodic cells), every key checked
by name; the world's own checks (sorted edges, weights summing to 1, a reward constant on the
support, the cell cap, the work limits, …) run when the ``World1D`` is built
(:mod:`~recast_cli.policy.world_limits`, below the world so that a world built in code is checked too).
"""

from __future__ import annotations

import math
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.policy.step_reward import StepReward
from recast_cli.policy.world1d import World1D
from recast_cli.policy.world_limits import MAX_CELLS, MAX_COMPONENTS

# ---------------------------------------------------------------------- the [world] table

#: Each reward form: the key that picks it, then every key it takes.
FORMS: dict[str, tuple[str, ...]] = {
    "edges": ("edges", "values"),
    "threshold": ("threshold", "below", "above"),
    "intervals": ("intervals", "inside", "outside"),
    "cell": ("cell", "pattern", "phase"),
}
WORLD_KEYS = ("weights", "means", "stds", "rewards")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"{where} = {value!r} is not a number")
    if not math.isfinite(value):
        raise BadInput(f"{where} = {value!r} is not a finite number")
    return float(value)


def _numbers(value: Any, where: str, limit: int = MAX_CELLS + 1) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise BadInput(f"{where} must be a list of numbers, got {value!r}"[:300])
    if len(value) > limit:
        raise BadInput(f"{where} has {len(value)} entries; at most {limit} are allowed")
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(value))


def reward_from_table(name: str, table: Any) -> StepReward:
    """One ``[world.rewards.NAME]`` table as a :class:`StepReward` (the forms of docs/settings.md)."""
    where = f"[world.rewards.{name}]"
    if not isinstance(table, dict):
        raise BadInput(f"{where} must be a table (edges/values, threshold, intervals or cell/pattern)")
    forms = [form for form in FORMS if form in table]
    if len(forms) != 1:
        given = " and ".join(forms) if forms else "none of them"
        raise BadInput(f"{where} takes exactly one of edges, threshold, intervals, cell; got {given}")
    form = forms[0]
    unknown = [key for key in table if key not in FORMS[form]]
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r}; a {form} reward takes {', '.join(FORMS[form])}")
    if form == "edges":
        if "values" not in table:
            raise BadInput(f"{where} needs values = one per cell, len(edges) + 1 of them")
        return StepReward(edges=_numbers(table["edges"], f"{where} edges"),
                          values=_numbers(table["values"], f"{where} values"))
    if form == "threshold":
        below = _number(table.get("below", 0), f"{where} below")
        above = _number(table.get("above", 1), f"{where} above")
        return StepReward(edges=(_number(table["threshold"], f"{where} threshold"),), values=(below, above))
    if form == "intervals":
        inside = _number(table.get("inside", 1), f"{where} inside")
        outside = _number(table.get("outside", 0), f"{where} outside")
        pairs = table["intervals"]
        if not isinstance(pairs, list) or not pairs or len(pairs) > MAX_CELLS // 2:
            raise BadInput(f"{where} intervals must be a list of 1 to {MAX_CELLS // 2} [lo, hi] pairs")
        edges: list[float] = []
        for i, pair in enumerate(pairs):
            lo_hi = _numbers(pair, f"{where} intervals[{i}]")
            if len(lo_hi) != 2:
                raise BadInput(f"{where} intervals[{i}] must be [lo, hi], got {pair!r}")
            edges += lo_hi
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise BadInput(f"{where} intervals must be increasing and disjoint, each lo < hi and apart from the "
                           f"next; got {pairs!r}"[:300])
        return StepReward(edges=tuple(edges), values=(outside, *[inside, outside] * len(pairs)))
    if "pattern" not in table:
        raise BadInput(f"{where} needs pattern = the values of consecutive cells, repeated (e.g. [0, 1]: odd cells)")
    return StepReward(cell=_number(table["cell"], f"{where} cell"),
                      values=_numbers(table["pattern"], f"{where} pattern"),
                      phase=_number(table.get("phase", 0), f"{where} phase"))


def world_from_table(table: Any, label: str = "the [world]") -> World1D:
    """A setting's ``[world]`` table as a checked :class:`World1D` (BadInput, one line, names what is wrong).

    ``means`` and ``stds`` (a list, one per component, or one number for all) are required,
    ``weights`` default to equal; ``[world.rewards.NAME]`` tables define the rewards in order.
    """
    if not isinstance(table, dict):
        raise BadInput("[world] must be a table (weights, means, stds, [world.rewards.NAME])")
    unknown = [key for key in table if key not in WORLD_KEYS]
    if unknown:
        raise BadInput(f"[world]: unknown key {unknown[0]!r}; allowed: {', '.join(WORLD_KEYS)}, and a "
                       "[world.rewards.NAME] table per reward")
    for key in ("means", "stds"):
        if key not in table:
            raise BadInput(f"[world] needs {key} (the mixture: means = [...], stds = one number or one per mean)")
    means = _numbers(table["means"], "[world] means", MAX_COMPONENTS)
    stds = table["stds"]
    stds = (_number(stds, "[world] stds"),) * len(means) if not isinstance(stds, list) else \
        _numbers(stds, "[world] stds", MAX_COMPONENTS)
    weights = _numbers(table["weights"], "[world] weights", MAX_COMPONENTS) if "weights" in table else \
        (1.0 / len(means),) * len(means)
    rewards = table.get("rewards", {})
    if not isinstance(rewards, dict):
        raise BadInput("[world] rewards must be tables: [world.rewards.NAME]")
    parsed = tuple((name, reward_from_table(name, spec)) for name, spec in rewards.items())
    return World1D(weights=weights, means=means, stds=stds, rewards=parsed, label=label)

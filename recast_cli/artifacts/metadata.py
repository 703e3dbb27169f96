"""The structured metadata blocks of the artifacts, checked on read like their tensors and columns: a gain
table's run metadata and its advantage correlations (E14), and W's ``info`` (the solve's facts, its
bootstrap, variant and conflicts). The writers run the same checks, so what recast writes reads back.

Every check raises :class:`~recast_cli.errors.BadInput` with one line naming the file and the key
(``info.conflicts[2].pair``): a hostile or hand-edited block is refused where it is read, never met
later as a TypeError in ``recast train`` or a conflict line printed 100 000 times by ``recast inspect``.
Keys a reader does not know are left alone (nothing reads them); a known key must have its shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from recast_cli.errors import BadInput, shown

#: What W's bootstrap verdict (``info.bootstrap.rows[r].verdict``, docs/trust.md) says of a row.
RESOLVED = "timing resolved"
UNRESOLVED = "not distinguishable from static at this budget"
VERDICTS = (RESOLVED, UNRESOLVED)
#: The variants of W (``info.variant``): name → tag, and the key that holds what the variant did.
VARIANTS = {"uncertainty-shrunk": ("E12u", "gamma"), "conflict-aware": ("E12c", "static_steps")}
#: What ``--bootstrap-over`` may be recorded as in a gain table (``estimate.gains.BOOTSTRAP_OVER``).
BOOTSTRAP_UNITS = ("auto", "prompts", "samples", "both")
#: A TV distance lies in [0, 1]; computed in floating point it may pass 1 by rounding.
TV_SLACK = 1e-9


def _refuse(where: str, key: str, what: str) -> NoReturn:
    """The one line: the file, the key (a dotted path into the block) and what is wrong with it."""
    raise BadInput(f"{where}: metadata {key!r} {what}")


def is_number(value: Any) -> bool:
    """A finite JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: Any, least: int = 0) -> bool:
    """A JSON integer of at least ``least`` (not a boolean)."""
    return type(value) is int and value >= least


def _number(value: Any, where: str, key: str, lo: float = -math.inf, hi: float = math.inf,
            nullable: bool = False, positive: bool = False) -> None:
    """A finite number in [lo, hi] (above 0 when ``positive``), or null when ``nullable``."""
    if nullable and value is None:
        return
    if not (is_number(value) and lo <= value <= hi and (value > 0 or not positive)):
        span = _span(lo, hi, positive)
        _refuse(where, key, f"must be {span}{' or null' if nullable else ''}, got {shown(value)}")


def _span(lo: float, hi: float, positive: bool) -> str:
    """What a number must be, in words."""
    if positive:
        return "a positive number" if math.isinf(hi) else f"a number in (0, {hi:g}]"
    if math.isinf(hi):
        return "a finite number" if math.isinf(lo) else f"a number >= {lo:g}"
    return f"a number in [{lo:g}, {hi:g}]"


def _count(value: Any, where: str, key: str, least: int = 0, nullable: bool = False) -> None:
    """An integer of at least ``least``, or null when ``nullable``."""
    if not ((nullable and value is None) or is_count(value, least)):
        _refuse(where, key, f"must be an integer >= {least}{' or null' if nullable else ''}, got {shown(value)}")


def _object(value: Any, where: str, key: str) -> dict:
    """A JSON object (given back, to be read on)."""
    if not isinstance(value, dict):
        _refuse(where, key, f"must be a JSON object, got {shown(value)}")
    return value


def _list(value: Any, where: str, key: str, most: int | None = None) -> list:
    """A list of at most ``most`` entries (given back): the count is checked before any entry is read."""
    if not isinstance(value, list):
        _refuse(where, key, f"must be a list, got {shown(value)}")
    if most is not None and len(value) > most:
        _refuse(where, key, f"lists {len(value)} entries; it can hold at most {most}")
    return value


def _per_reward(value: Any, rewards: Sequence[str], where: str, key: str, check: Callable[[Any, str], None]) -> None:
    """An object with one entry per reward of ``rewards`` (no other), each passing ``check(value, key)``."""
    _object(value, where, key)
    if set(value) != set(rewards):
        _refuse(where, key, f"must name the rewards {', '.join(rewards)} once each, got {shown(sorted(value))}")
    for name in rewards:
        check(value[name], f"{key}.{name}")


def _names(value: Any, rewards: Sequence[str], where: str, key: str) -> None:
    """A list of distinct reward names of ``rewards``."""
    _list(value, where, key, most=len(rewards))
    if not all(isinstance(r, str) and r in rewards for r in value) or len(set(value)) != len(value):
        _refuse(where, key, f"must list distinct rewards of {', '.join(rewards)}, got {shown(value)}")


def _steps(value: Any, T: int, where: str, key: str, empty: bool = False) -> None:
    """Steps 1 … T, distinct, ascending (non-empty unless ``empty``)."""
    _list(value, where, key, most=T)
    if (not (value or empty) or not all(is_count(t, 1) and t <= T for t in value)
            or any(a >= b for a, b in zip(value, value[1:]))):
        _refuse(where, key, f"must list distinct steps of 1 … {T} in ascending order, got {shown(value)}")


def _pairs(pairs: list, rewards: Sequence[str], where: str, key: Callable[[int], str]) -> None:
    """Each entry a pair [a, b] of two distinct rewards of ``rewards``, no pair twice (in either order);
    ``key(k)`` names entry k."""
    seen: set[frozenset[str]] = set()
    for k, pair in enumerate(pairs):
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(r, str) and r in rewards for r in pair)
                or pair[0] == pair[1]):
            _refuse(where, key(k), f"names a pair {shown(pair)} that is not two rewards of {', '.join(rewards)}")
        if frozenset(pair) in seen:
            _refuse(where, key(k), f"names the pair {pair[0]}, {pair[1]} a second time")
        seen.add(frozenset(pair))


def most_pairs(m: int) -> int:
    """m(m − 1)/2: how many pairs m rewards form."""
    return m * (m - 1) // 2


# --------------------------------------------------------------------------- a gain table


def check_advantage_corr(corr: Any, rewards: Sequence[str], T: int, where: str) -> None:
    """E14's record: ``{"pairs": [[a, b], …], "rho": [[ρ_1 … ρ_T], …], "n": groups, "K": rollouts}``, one row
    of ρ per pair of distinct rewards of the table (each pair once, at most m(m − 1)/2 of them), each ρ in
    [−1, 1] (or null where a reward did not vary)."""
    key = "advantage_corr"
    _object(corr, where, key)
    if not {"pairs", "rho", "n"} <= set(corr):
        _refuse(where, key, "must hold 'pairs', 'rho' and 'n'")
    pairs = _list(corr["pairs"], where, f"{key}.pairs", most=most_pairs(len(rewards)))
    rho = _list(corr["rho"], where, f"{key}.rho")
    if len(pairs) != len(rho):
        _refuse(where, key, f"must hold one row of 'rho' per pair, got {len(rho)} rows for {len(pairs)} pairs")
    _count(corr["n"], where, f"{key}.n", least=1)
    if "K" in corr:
        _count(corr["K"], where, f"{key}.K", least=2)
    _pairs(pairs, rewards, where, lambda k: f"{key}.pairs[{k}]")
    for k, (pair, row) in enumerate(zip(pairs, rho)):
        if not isinstance(row, list) or len(row) != T or not all(v is None or (is_number(v) and -1 <= v <= 1)
                                                                  for v in row):
            _refuse(where, f"{key}.rho[{k}]", f"must give pair {pair[0]}, {pair[1]} one correlation in [-1, 1] "
                                              f"(or null) per step 1 … {T}")


def check_gain_meta(meta: dict[str, Any], rewards: Sequence[str], T: int, where: str) -> None:
    """The run metadata of a gain table beyond its tags (``sampling``, ``monotone`` and ``grid`` are the
    reader's): α and β, N, K and P (null for an exact table), the flags, each reward's scale, and
    ``advantage_corr`` when recorded."""
    for key in ("alpha", "beta"):
        _number(meta[key], where, key, positive=True)
    for key in ("N", "K", "P"):
        _count(meta[key], where, key, least=1, nullable=True)
    if meta["crn"] is not None and not isinstance(meta["crn"], bool):
        _refuse(where, "crn", f"must be true, false or null, got {shown(meta['crn'])}")
    _per_reward(meta["reward_std"], rewards, where, "reward_std",
                lambda v, key: _number(v, where, key, lo=0.0))
    for key in ("policy", "positives"):
        _object(meta[key], where, key)
    for key in ("jackknife", "standardise"):
        if key in meta and not isinstance(meta[key], bool):
            _refuse(where, key, f"must be true or false, got {shown(meta[key])}")
    if "bootstrap" in meta:
        _count(meta["bootstrap"], where, "bootstrap", nullable=True)
    if meta.get("bootstrap_over") is not None and meta["bootstrap_over"] not in BOOTSTRAP_UNITS:
        _refuse(where, "bootstrap_over", f"must be one of {', '.join(BOOTSTRAP_UNITS)}, got "
                                         f"{shown(meta['bootstrap_over'])}")
    for key in ("rollout_noise", "guidance_scale"):
        if key in meta:
            _number(meta[key], where, key, nullable=True)
    if meta.get("advantage_corr") is not None:
        check_advantage_corr(meta["advantage_corr"], rewards, T, where)


# --------------------------------------------------------------------------- W's info


def check_weights_info(info: Any, rewards: Sequence[str], T: int, kernels: Sequence[str], where: str) -> None:
    """W's ``info`` (what ``solve-w``, ``recast train --weights static`` and ``recast study`` record): every
    key optional (older files lack the newer ones), each one present of its shape, every reward it names
    one of W's rows and every step one of W's 1 … T."""
    _object(info, where, "info")
    scalars: dict[str, Callable[[Any, str], None]] = {
        "iterations": lambda v, k: _count(v, where, k),
        "marginal_error": lambda v, k: _number(v, where, k, lo=0.0),
        "floor": lambda v, k: _number(v, where, k, lo=0.0, hi=1.0),
        "source_T": lambda v, k: _count(v, where, k, least=1),
        "shrink": lambda v, k: _number(v, where, k, hi=1.0, positive=True),
        "indiscriminable": lambda v, k: _names(v, rewards, where, k),
        "spill_share": lambda v, k: _per_reward(v, rewards, where, k,
                                                lambda s, key: _number(s, where, key, 0.0, 1.0, nullable=True)),
    }
    for key, check in scalars.items():
        if key in info:
            check(info[key], f"info.{key}")
    for key, kinds in (("resampled", (bool,)), ("built_by", (str,))):
        if key in info and not isinstance(info[key], kinds):
            _refuse(where, f"info.{key}", f"must be a {'boolean' if kinds == (bool,) else 'string'}, got "
                                          f"{shown(info[key])}")
    if "kernel" in info and info["kernel"] not in kernels:
        _refuse(where, "info.kernel", f"must be one of {', '.join(kernels)}, got {shown(info['kernel'])}")
    if info.get("bootstrap") is not None:
        _check_bootstrap(info["bootstrap"], rewards, where)
    if info.get("variant") is not None:
        _check_variant(info["variant"], rewards, T, where)
    if "conflicts" in info:
        _check_conflicts(info["conflicts"], rewards, T, where)
    if "settled_by_timing" in info:
        _check_settled(info["settled_by_timing"], rewards, T, where)


def _check_bootstrap(boot: Any, rewards: Sequence[str], where: str) -> None:
    """``info.bootstrap``: the draws W was solved again on, N, P and K of the estimate, each row's spread and
    verdict, and the samples per prompt each target spread needs. ``solve-w`` solves on 2 draws or more (one
    measures no spread); a file an older recast wrote with ``--bootstrap 1`` still reads."""
    key = "info.bootstrap"
    _object(boot, where, key)
    if "draws" not in boot or "rows" not in boot:
        _refuse(where, key, "must hold 'draws' and 'rows'")
    _count(boot["draws"], where, f"{key}.draws", least=1)
    for name in ("samples", "P", "K"):
        _count(boot.get(name), where, f"{key}.{name}", least=1, nullable=True)

    def tv(value: Any, k: str) -> None:
        _number(value, where, k, 0.0, 1.0 + TV_SLACK)

    def row(value: Any, k: str) -> None:
        _object(value, where, k)
        for name, size in (("tv_point", 3), ("tv_static_range", 2)):
            points = _list(value.get(name), where, f"{k}.{name}")
            if len(points) != size:
                _refuse(where, f"{k}.{name}", f"must hold {size} numbers, got {len(points)}")
            for j, v in enumerate(points):
                tv(v, f"{k}.{name}[{j}]")
        tv(value.get("tv_static"), f"{k}.tv_static")
        if value.get("verdict") not in VERDICTS:
            _refuse(where, f"{k}.verdict", f"must be one of {', '.join(map(repr, VERDICTS))}, got "
                                           f"{shown(value.get('verdict'))}")
        _number(value.get("samples_to_resolve"), where, f"{k}.samples_to_resolve", lo=0.0, nullable=True)

    _per_reward(boot["rows"], rewards, where, f"{key}.rows", row)
    budget = boot.get("samples_for_tv")
    if budget is not None:
        _object(budget, where, f"{key}.samples_for_tv")
        for target, n in budget.items():
            if not (is_number(_float_or_none(target)) and 0 < float(target) <= 1):
                _refuse(where, f"{key}.samples_for_tv", f"must be keyed by target spreads in (0, 1], got "
                                                        f"{shown(target)}")
            _number(n, where, f"{key}.samples_for_tv.{target}", lo=0.0, nullable=True)


def _float_or_none(text: str) -> float | None:
    """A key of ``samples_for_tv`` (a target spread written as text) as a number; None when it is not one."""
    try:
        return float(text)
    except ValueError:
        return None


def _check_variant(variant: Any, rewards: Sequence[str], T: int, where: str) -> None:
    """``info.variant``: E12u with each row's share γ in [0, 1], or E12c with its static steps."""
    key = "info.variant"
    _object(variant, where, key)
    name = variant.get("name")
    if name not in VARIANTS or variant.get("tag") != VARIANTS[name][0] or VARIANTS[name][1] not in variant:
        _refuse(where, key, "must be " + " or ".join(f"{{name: {n!r}, tag: {t!r}, {k}}}"
                                                      for n, (t, k) in VARIANTS.items()))
    if name == "uncertainty-shrunk":
        _per_reward(variant["gamma"], rewards, where, f"{key}.gamma",
                    lambda v, k: _number(v, where, k, 0.0, 1.0))
    else:
        _steps(variant["static_steps"], T, where, f"{key}.static_steps", empty=True)


def _check_conflicts(conflicts: Any, rewards: Sequence[str], T: int, where: str) -> None:
    """``info.conflicts``: each pair of rewards at most once, with its steps and lowest correlation."""
    key = "info.conflicts"
    _list(conflicts, where, key, most=most_pairs(len(rewards)))
    for k, c in enumerate(conflicts):
        if not isinstance(c, dict) or not {"pair", "steps", "rho_min"} <= set(c):
            _refuse(where, f"{key}[{k}]", f"must be {{pair, steps, rho_min}}, got {shown(c)}")
        _steps(c["steps"], T, where, f"{key}[{k}].steps")
        _number(c["rho_min"], where, f"{key}[{k}].rho_min", -1.0, 1.0)
    _pairs([c["pair"] for c in conflicts], rewards, where, lambda k: f"{key}[{k}].pair")


def _check_settled(settled: Any, rewards: Sequence[str], T: int, where: str) -> None:
    """``info.settled_by_timing``: each pair at most once, its steps and, per step, which of the two owns it."""
    key = "info.settled_by_timing"
    _list(settled, where, key, most=most_pairs(len(rewards)))
    for k, item in enumerate(settled):
        if not isinstance(item, dict) or not {"pair", "steps", "owner"} <= set(item):
            _refuse(where, f"{key}[{k}]", f"must be {{pair, steps, owner}}, got {shown(item)}")
    _pairs([item["pair"] for item in settled], rewards, where, lambda k: f"{key}[{k}].pair")
    for k, item in enumerate(settled):
        _steps(item["steps"], T, where, f"{key}[{k}].steps")
        owner = item["owner"]
        if not isinstance(owner, list) or len(owner) != len(item["steps"]) or any(o not in item["pair"] for o in owner):
            _refuse(where, f"{key}[{k}].owner", f"must name, per step, one of {item['pair'][0]} and "
                                                f"{item['pair'][1]}, got {shown(owner)}")

"""Per-reward endpoints of a study's cells (issue 42): which reward each seed learned, and which it lost.

Every seed of a cell starts from the same base policy (its evaluation is in the cell's metadata,
``base``), and every reward of the 1-D world has a known range (``reward_range``). So each reward's
final value under the ODE can be put on one scale, its **normalised gain**

    gain_i = (r_i(final, ODE) − r_i(base, ODE)) / (max r_i − r_i(base, ODE))

(1: the reward reached its ceiling; 0: no better than the base policy; below 0: worse). Then, per seed:

* a reward is **lost** when its gain is below δ (``[study] lost_delta``, default
  :data:`~recast_cli.artifacts.cells.DEFAULT_LOST_DELTA`): it closed less than δ of its headroom;
* the **worst-reward endpoint** is min_i gain_i;
* the seed **lost a reward** when any reward is lost.

Paired by seed against static in the same condition (G, learning rate), the lost-a-reward outcome
is compared with McNemar's exact test: under the null, the seeds that only one arm lost split
half-half (a two-sided binomial test on the discordant seeds).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recast_cli.artifacts import CellTable
from recast_cli.report.tables import fixed, markdown_table


@dataclass(frozen=True)
class SeedRewards:
    """One seed of one cell: every reward's final value (SDE, ODE), its normalised gain (None without
    the cell's base evaluation), the rewards it lost and its worst normalised gain."""

    sde: tuple[float, ...]
    ode: tuple[float, ...]
    gain: tuple[float, ...] | None
    lost: tuple[str, ...]
    worst: float | None


def final_values(cell: CellTable, sampler: str) -> np.ndarray:
    """[S, m] every reward's value at the cell's last point under ``sampler``."""
    points = [(step, k) for k, (step, s) in enumerate(cell.points) if s == sampler]
    return cell.evals[:, max(points)[1], : len(cell.rewards)]


def normalised_gains(cell: CellTable) -> np.ndarray | None:
    """[S, m] each reward's final ODE gain over the base policy, as a share of its headroom (module docstring);
    None for a cell without the base evaluation (made by a recast before issue 42)."""
    base, ranges = cell.meta.get("base"), cell.meta.get("reward_range")
    if not base or not ranges:
        return None
    start = np.asarray(base["ode"][: len(cell.rewards)], dtype=np.float64)
    ceiling = np.asarray([ranges[r][1] for r in cell.rewards], dtype=np.float64)
    room = np.where(ceiling - start > 0, ceiling - start, np.nan)
    return (final_values(cell, "ode") - start) / room


def seed_rewards(cell: CellTable, delta: float) -> dict[int, SeedRewards]:
    """Seed → its per-reward endpoints (:class:`SeedRewards`) with lost-reward threshold ``delta``."""
    sde, ode, gains = final_values(cell, "sde"), final_values(cell, "ode"), normalised_gains(cell)
    out = {}
    for s, seed in enumerate(cell.seeds):
        g = None if gains is None else tuple(float(x) for x in gains[s])
        lost = () if g is None else tuple(r for r, x in zip(cell.rewards, g) if not x >= delta)
        worst = None if g is None else float(np.nanmin(g))
        out[seed] = SeedRewards(tuple(map(float, sde[s])), tuple(map(float, ode[s])), g, lost, worst)
    return out


def mcnemar(static_lost: dict[int, bool], arm_lost: dict[int, bool]) -> tuple[int, int, float]:
    """(static only, arm only, exact two-sided p) over the seeds both have: McNemar's exact test."""
    seeds = sorted(set(static_lost) & set(arm_lost))
    only_static = sum(1 for s in seeds if static_lost[s] and not arm_lost[s])
    only_arm = sum(1 for s in seeds if arm_lost[s] and not static_lost[s])
    n = only_static + only_arm
    from scipy.stats import binomtest  # here: `recast --help` imports no scipy

    return only_static, only_arm, (binomtest(only_arm, n, 0.5).pvalue if n else 1.0)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson 95% interval of a proportion k/n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def table_lost(per_arm: dict[str, dict[int, SeedRewards]], rewards: Sequence[str]) -> str:
    """Per arm: the lost-reward rate (Wilson 95%), which reward was lost how often, the worst-reward
    endpoint (mean ± sd), each reward's mean final ODE value, and McNemar against static."""
    static = per_arm.get("static")
    static_lost = {s: bool(x.lost) for s, x in static.items()} if static else None
    rows = []
    for arm, seeds in per_arm.items():
        known = {s: x for s, x in seeds.items() if x.gain is not None}
        if not known:
            rows.append([arm, "—", "—", "—", *("—" for _ in rewards), "—"])
            continue
        k = sum(1 for x in known.values() if x.lost)
        lo, hi = wilson(k, len(known))
        counts = ", ".join(f"{r} {sum(r in x.lost for x in known.values())}" for r in rewards)
        worst = np.array([x.worst for x in known.values()])
        means = [fixed(float(np.mean([x.ode[i] for x in known.values()])), 3) for i in range(len(rewards))]
        test = "—"
        if static_lost is not None and arm != "static":
            a, b, p = mcnemar(static_lost, {s: bool(x.lost) for s, x in known.items()})
            test = f"{a} / {b}, p = {p:.3g}"
        rows.append([arm, f"{k}/{len(known)} = {fixed(k / len(known), 3)} [{fixed(lo, 3)}, {fixed(hi, 3)}]", counts,
                     f"{fixed(float(worst.mean()), 4)} ± {fixed(float(worst.std(ddof=1)), 4) if len(worst) > 1 else '—'}",
                     *means, test])
    return markdown_table(["arm", "lost a reward (95% Wilson)", "lost, per reward", "worst-reward gain",
                           *(f"final {r} (ODE)" for r in rewards), "McNemar: static only / arm only"], rows)


def stall_counts(cell: CellTable) -> dict[str, tuple[int, int]] | None:
    """Reward → (seeds whose training flagged it stalled at some step, seeds that ended stalled), by the
    detector of ``recast train`` (``train.stall``, its defaults) on each seed's per-step batch means and
    within-group spreads; None for a cell without the spreads (made before cell format 3)."""
    from recast_cli.train.stall import DEFAULT_WINDOW, initial_scale, stall_flags

    if any(f"reward_spread/{r}" not in cell.train for r in cell.rewards):
        return None
    means = np.stack([cell.train[f"reward/{r}"] for r in cell.rewards], axis=-1)  # [S, steps, m]
    spreads = np.stack([cell.train[f"reward_spread/{r}"] for r in cell.rewards], axis=-1)
    flags = stall_flags(means, initial_scale(spreads, DEFAULT_WINDOW), spreads=spreads)
    return {r: (int(flags[:, :, i].any(axis=1).sum()), int(flags[:, -1, i].sum())) for i, r in enumerate(cell.rewards)}


def table_stalls(per_arm: dict[str, CellTable]) -> str:
    """Per arm and reward: how many seeds' training flagged the reward stalled, and how many ended stalled."""
    rows = []
    for arm, cell in per_arm.items():
        counts = stall_counts(cell)
        if counts is not None:
            rows.append([arm, *(f"{a} ({b})" for a, b in counts.values()), str(len(cell.seeds))])
    if not rows:
        return ""
    rewards = next(iter(per_arm.values())).rewards
    return (markdown_table(["arm", *(f"{r} stalled (at the end)" for r in rewards), "seeds"], rows) +
            "\nStalled: `recast train`'s stall detector (docs/train.md, its defaults) on each seed's training "
            "batch means: the reward made no progress over the window while another rose.\n")


def table_reward_snr(cells: Sequence[CellTable], arms: Sequence[str]) -> str:
    """Per arm and reward: the batch gradient's signal-to-noise at each measured iteration
    (``train.stacked_gradients``: split-half, means over seeds)."""
    rows = []
    for arm in arms:
        for cell in (c for c in cells if c.label == arm):
            record = cell.meta.get("reward_gradients") or {}
            for r in cell.rewards:
                snr = record.get("snr", {}).get(r)
                if snr:
                    rows.append([arm, r, " · ".join("—" if x is None else f"{x:.3g}" for x in snr)])
    if not rows:
        return "No per-reward gradient measurements in these cells.\n"
    iterations = next((c.meta["reward_gradients"]["iterations"] for c in cells if c.meta.get("reward_gradients")), [])
    return (markdown_table(["arm", "reward", f"SNR at iterations {', '.join(map(str, iterations))}"], rows) +
            "\nSNR: |E g_i|² / E|g_i − E g_i|² of reward i's share of the batch's first-update gradient "
            "(split-half estimate within each seed, means over seeds).\n")


def endpoints_csv(rows: Sequence[tuple[CellTable, float, dict[int, tuple[float | None, float | None]],
                                       dict[int, SeedRewards]]]) -> bytes:
    """Every seed's endpoints as a CSV a plain ``pandas.read_csv`` reads: one row per cell and seed; λ
    as one column per reward; the per-reward final values (SDE, ODE), gains and the lost rewards."""
    rewards = rows[0][0].rewards
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header(rewards))
    for cell, rate, ends, per_seed in rows:
        for seed in sorted(per_seed):
            x, (p, q) = per_seed[seed], ends[seed]
            gains = x.gain or (None,) * len(rewards)
            writer.writerow([cell.label, *(f"{v:g}" for v in cell.meta["lambda"]), cell.meta["group_size"],
                             f"{rate:g}", seed, _num(p), _num(q), _num(x.worst), len(x.lost), "+".join(x.lost),
                             *map(_num, x.sde), *map(_num, x.ode), *map(_num, gains)])
    return buffer.getvalue().encode()


def header(rewards: Sequence[str]) -> list[str]:
    """The columns of ``endpoints.csv`` (its first line, which also marks it as recast's)."""
    return ["arm", *(f"lambda_{r}" for r in rewards), "group_size", "learning_rate", "seed", "primary", "secondary",
            "worst_gain", "lost", "lost_rewards", *(f"sde_{r}" for r in rewards), *(f"ode_{r}" for r in rewards),
            *(f"gain_{r}" for r in rewards)]


def _num(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))

"""The report's Markdown tables in the paper's layout: Tables 1–4 and 6–10, the 1-D world's endpoint tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.report.inputs import (
    AGGREGATE,
    MODE_LABEL,
    MODE_ORDER,
    ARM_ORDER,
    Budget,
    Curve,
    Evaluation,
    Gains,
    Inputs,
    Judgements,
    Run,
    budget_label,
    recast_side,
    sort_gains,
)
from recast_cli.report.statistics import Contrast, Grid, Stat, pareto, win_rate


def fixed(x: float, decimals: int) -> str:
    text = f"{x:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text  # never "-0.000"


def show(stat: Stat | None, decimals: int) -> str:
    if stat is None:
        return "—"
    return fixed(stat.mean, decimals) + ("" if stat.std is None else f" ± {fixed(stat.std, decimals)}")


def decimals_for(values: Iterable[float]) -> int:
    """Three decimals; two for a scorer whose scale is an order of magnitude larger (as HPSv3 in the paper)."""
    return 2 if max((abs(v) for v in values), default=0.0) >= 10 else 3


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table_inputs(inputs: Inputs) -> str:
    """Every input with its kind, what it holds and its digest, in a fixed order."""
    rows = []
    for e in inputs.evals:
        rows.append(((0, MODE_ORDER.index(e.mode), e.budget, e.seed is None, e.seed or 0, e.name),
                     [e.name, "evaluation", MODE_LABEL[e.mode], budget_label(e.budget) if e.mode != "base" else "—",
                      "—" if e.seed is None else str(e.seed), "—" if e.step is None else str(e.step), e.sha256[:12]]))
    for r in inputs.runs:
        last = max(r.curve) if r.curve else None
        rows.append(((1, MODE_ORDER.index(r.mode), r.budget, r.seed is None, r.seed or 0, r.name),
                     [r.name, "run", MODE_LABEL[r.mode], budget_label(r.budget),
                      "—" if r.seed is None else str(r.seed), "—" if last is None else str(last), r.sha256[:12]]))
    for g in inputs.gains:
        rows.append(((2, g.checkpoint is not None, (), False, 0, g.label, g.name),
                     [g.name, "gains", g.label, "—", "—", "—", g.sha256[:12]]))
    for j in inputs.judgements:
        rows.append(((3, 0, (), False, 0, j.name), [j.name, "judgements", "—", "—", "—", "—", j.sha256[:12]]))
    rows.sort(key=lambda item: item[0])
    header = ["input", "kind", "what", "λ", "train seed", "step", "sha256"]
    return markdown_table(header, [row for _, row in rows], ["l"] * len(header))


# --------------------------------------------------------------------------- Tables 1, 2, 4, 7–10


def scorer_decimals(grid: Grid, scorer: str) -> int:
    return decimals_for(grid.values(scorer))


def _bold_pair(cells: dict[str, str], stats: dict[str, Stat | None], decimals: int) -> None:
    """Bold the better of static and ReCAST at the shown precision, both when they agree (the paper's rule)."""
    if stats.get("static") is None or stats.get("recast") is None:
        return
    ours, theirs = (float(fixed(stats[m].mean, decimals)) for m in ("recast", "static"))
    for mode in ("recast", "static"):
        if (ours >= theirs) if mode == "recast" else (theirs >= ours):
            cells[mode] = f"**{cells[mode]}**"


def table_pooled(grid: Grid, scorers: Sequence[str], first: str) -> str:
    """Tables 1 and 2: rows of scorers; columns base / static / no-Sink / ReCAST and ReCAST's wins."""
    modes = (["base"] if grid.base else []) + grid.modes
    compare = "static" in grid.modes and "recast" in grid.modes
    header = [first, *(MODE_LABEL[m] for m in modes)] + (["ReCAST wins"] if compare else [])
    rows = []
    for scorer in scorers:
        decimals = scorer_decimals(grid, scorer)
        stats = {m: grid.base_value(scorer) if m == "base" else grid.pooled(m, scorer) for m in modes}
        cells = {m: show(stats[m], decimals) for m in modes}
        _bold_pair(cells, stats, decimals)
        row = [scorer, *(cells[m] for m in modes)]
        if compare:
            won, total = grid.wins(scorer)
            row.append(f"{won} of {total}" if total else "—")
        rows.append(row)
    return markdown_table(header, rows)


def table_aggregate_per_budget(grid: Grid) -> str:
    """Table 4: the aggregate per λ for static, no-Sink and ReCAST, and its mean over λ."""
    decimals = scorer_decimals(grid, AGGREGATE)
    header = ["method", *(budget_label(b) for b in grid.budgets), "mean"]
    rows = []
    for mode in grid.modes:
        stats = [grid.stat(mode, AGGREGATE, b) for b in grid.budgets]
        present = [s.mean for s in stats if s is not None]
        mean = fixed(float(np.mean(present)), decimals) if len(present) == len(stats) else "—"
        rows.append([MODE_LABEL[mode], *(show(s, decimals) for s in stats), mean])
    return markdown_table(header, rows)


def table_per_budget(grid: Grid, scorers: Sequence[str], with_aggregate: bool) -> str:
    """Tables 7–10: per λ, static and ReCAST rows over the scorers, and the Pareto verdict over them."""
    columns = ([AGGREGATE] if with_aggregate else []) + list(scorers)
    modes = [m for m in ("static", "recast") if m in grid.modes]
    header = ["λ", "method", *columns, "Pareto"]
    rows = []
    for budget in grid.budgets:
        stats = {(m, c): grid.stat(m, c, budget) for m in modes for c in columns}
        verdict = "—"
        if all(stats.get((m, c)) is not None for m in ("static", "recast") for c in scorers):
            verdict = pareto([stats[("recast", c)].mean for c in scorers], [stats[("static", c)].mean for c in scorers])
        cells = {(m, c): show(stats[(m, c)], scorer_decimals(grid, c)) for m in modes for c in columns}
        for c in columns:
            pair = {m: cells[(m, c)] for m in modes}
            _bold_pair(pair, {m: stats[(m, c)] for m in modes}, scorer_decimals(grid, c))
            cells.update({(m, c): pair[m] for m in modes})
        for mode in modes:
            if any(stats[(mode, c)] is not None for c in columns):
                rows.append([budget_label(budget), MODE_LABEL[mode], *(cells[(mode, c)] for c in columns), verdict])
    return markdown_table(header, rows, ["l", "l", *(["r"] * len(columns)), "l"])


# --------------------------------------------------------------------------- stalled rewards of the runs


def stall_cell(run: Run) -> str:
    """A run's stalled rewards: each with the first step flagged, the steps flagged and whether the run ends
    stalled; "none"; "not recorded" (no flags in its metrics)."""
    if run.stalls is None:
        return "not recorded"
    cells = [f"{s.reward} from step {s.first} ({s.steps} steps" + (f", stalled since step {s.since} at the end)"
                                                                   if s.since is not None else ")")
             for s in run.stalls.values() if s.first is not None]
    return "; ".join(cells) or "none"


def table_run_stalls(runs: Sequence[Run]) -> str:
    """Per run: arm, λ, seed, its last step and its stalled rewards (``train/stall``)."""
    rows = [[r.name, MODE_LABEL[r.mode], budget_label(r.budget), "—" if r.seed is None else str(r.seed),
             str(max(r.curve)) if r.curve else "—", stall_cell(r)] for r in runs]
    return markdown_table(["run", "arm", "λ", "seed", "steps", "stalled rewards"], rows, ["l", "l", "l", "r", "r", "l"])


def table_arm_stalls(runs: Sequence[Run]) -> str:
    """Per arm and λ: runs with recorded flags, how many had a stall, how many end stalled, and per reward
    how many runs it stalled in."""
    rewards = list(dict.fromkeys(name for r in runs for name in r.rewards))
    groups: dict[tuple[str, Budget], list[Run]] = {}
    for r in runs:
        if r.stalls is not None:
            groups.setdefault((r.mode, r.budget), []).append(r)
    rows = []
    for (mode, budget), group in sorted(groups.items(), key=lambda kv: (MODE_ORDER.index(kv[0][0]), kv[0][1])):
        rows.append([MODE_LABEL[mode], budget_label(budget), str(len(group)),
                     _runs_with(group, lambda s: s.first is not None), _runs_with(group, lambda s: s.since is not None),
                     *(_runs_with(group, lambda s, name=name: s.reward == name and s.first is not None)
                       for name in rewards)])
    header = ["arm", "λ", "runs", "with a stall", "ending stalled", *(f"{name} stalled" for name in rewards)]
    return markdown_table(header, rows)


def _runs_with(group: Sequence[Run], hit: Callable[[Any], bool]) -> str:
    """"k of n": the runs of ``group`` with a reward's stall span (``Run.stalls``) for which ``hit`` holds."""
    return f"{sum(1 for r in group if any(hit(s) for s in r.stalls.values()))} of {len(group)}"


# --------------------------------------------------------------------------- Table 3


@dataclass(frozen=True)
class JudgeColumn:
    header: str
    order: tuple[Any, ...]
    rates: dict[str, float]
    pairs: int


def judge_columns(judgements: Sequence[Judgements], evals: Sequence[Evaluation]) -> tuple[list[JudgeColumn], list[str]]:
    """Table 3: per file, ReCAST's win rate per criterion, both orders counted: (wins + ½·ties) / verdicts."""
    columns = []
    for j in judgements:
        side, budget, opponent = recast_side(j, evals)
        rates = {criterion: win_rate([row[criterion] for row in j.rows], side) for criterion in j.criteria}
        header = budget_label(budget) if budget is not None else Path(j.name).stem
        if opponent != "static":
            header += f" vs {MODE_LABEL.get(opponent, opponent)}"
        order = (0, budget) if budget is not None else (1, ())
        columns.append(JudgeColumn(header, (*order, header, j.name), rates, len({r["pair"] for r in j.rows})))
    counts: dict[str, int] = {}
    for c in columns:
        counts[c.header] = counts.get(c.header, 0) + 1
    columns = [JudgeColumn(f"{c.header} ({c.order[-1]})" if counts[c.header] > 1 else c.header, c.order, c.rates,
                           c.pairs) for c in columns]
    columns.sort(key=lambda c: c.order)
    criteria = list(dict.fromkeys(["overall", *(k for c in columns for k in c.rates)]))
    return columns, criteria


def table_judge(columns: Sequence[JudgeColumn], criteria: Sequence[str]) -> str:
    header = ["criterion", *(c.header for c in columns)] + (["mean"] if len(columns) > 1 else [])
    rows = []
    for criterion in criteria:
        rates = [c.rates.get(criterion) for c in columns]
        row = [criterion.capitalize(), *("—" if r is None else fixed(r, 4) for r in rates)]
        if len(columns) > 1:
            present = [r for r in rates if r is not None]
            row.append(fixed(float(np.mean(present)), 4))
        rows.append(row)
    pairs = [str(c.pairs) for c in columns]
    rows.append(["pairs", *pairs] + ([str(sum(c.pairs for c in columns))] if len(columns) > 1 else []))
    return markdown_table(header, rows)


# --------------------------------------------------------------------------- Table 6


def table_gains(gains: Sequence[Gains]) -> str:
    """Table 6: Σ_t ΔD_{i,t} (= D_{i,0}, E5) per reward at the base policy and at trained checkpoints."""
    ordered = sort_gains(gains)
    base = ordered[0] if ordered[0].checkpoint is None else None
    trained = [g for g in ordered if g.checkpoint is not None]
    rewards = list(ordered[0].table.rewards)
    totals = {g.label: dict(zip(g.table.rewards, g.table.total_gain().tolist())) for g in ordered}
    header = ["reward", *(g.label for g in ordered)]
    if base is not None:
        header += [f"remaining ({g.label})" for g in trained]
    rows = []
    for reward in [*rewards, None]:
        values = {g.label: sum(totals[g.label].values()) if reward is None else totals[g.label][reward]
                  for g in ordered}
        row = ["all rewards" if reward is None else reward, *(fixed(values[g.label], 3) for g in ordered)]
        if base is not None:
            before = values[base.label]
            row += [f"{fixed(values[g.label] / before, 2)}×" if before > 0 else "—" for g in trained]
        rows.append(row)
    return markdown_table(header, rows)


# --------------------------------------------------------------------------- the 1-D world


def contrast_row(contrast: Contrast, decimals: int = 4) -> list[str]:
    """One contrast: seeds, mean, sd, 95% t-interval, seeds ahead/behind and the sign test's p."""
    interval = contrast.t_interval()
    wins, losses, p = contrast.sign_test()
    sd = contrast.sd
    return [f"{MODE_LABEL.get(contrast.mode, contrast.mode)} − static", str(len(contrast.diffs)), fixed(contrast.mean, decimals),
            "—" if math.isnan(sd) else fixed(sd, decimals),
            "—" if interval is None else f"[{fixed(interval[0], decimals)}, {fixed(interval[1], decimals)}]",
            f"{wins}/{losses}", "—" if math.isnan(p) else f"{p:.3f}"]


def table_contrasts(items: Sequence[Contrast]) -> str:
    header = ["contrast", "seeds", "mean", "sd", "95% t-interval", "ahead/behind", "sign test p"]
    return markdown_table(header, [contrast_row(c) for c in items])


def table_arms(grid: dict[tuple[str, Budget, int], float]) -> str:
    """An endpoint per λ and arm: mean ± sd over seeds."""
    budgets = sorted({b for (_, b, _) in grid})
    modes = [m for m in ARM_ORDER if any(k[0] == m for k in grid)]
    rows = []
    for b in budgets:
        cells = [budget_label(b)]
        for m in modes:
            values = [v for (mm, bb, _), v in sorted(grid.items()) if mm == m and bb == b]
            cells.append("—" if not values else f"{fixed(np.mean(values), 4)} ± "
                         f"{fixed(np.std(values, ddof=1), 4) if len(values) > 1 else '—'} (n = {len(values)})")
        rows.append(cells)
    return markdown_table(["λ", *(MODE_LABEL[m] for m in modes)], rows)


def table_final_rewards(curves: Sequence[Curve]) -> str:
    """Per arm and λ: each reward's mean at the last SDE checkpoint, averaged over seeds."""
    by: dict[tuple[str, Budget], list[np.ndarray]] = {}
    rewards: tuple[str, ...] = ()
    for c in curves:
        sde = [(step, k) for k, (step, sampler) in enumerate(c.table.points) if sampler == "sde"]
        if not sde or (c.mode != "base" and max(sde)[0] == 0):
            continue
        rewards = c.table.scorers[:-1]
        by.setdefault((c.mode, c.budget if c.mode != "base" else ()), []).append(c.table.mean[max(sde)[1], :-1])
    rows = []
    for (mode, budget), values in sorted(by.items(), key=lambda kv: (("base", *ARM_ORDER).index(kv[0][0]), kv[0][1])):
        arr = np.array(values)
        rows.append([MODE_LABEL[mode], budget_label(budget) if budget else "—", str(len(values)),
                     *(fixed(v, 4) for v in arr.mean(axis=0))])
    return markdown_table(["arm", "λ", "seeds", *rewards], rows)


def table_curve_inputs(curves: Sequence[Curve]) -> str:
    """Every curve table with its arm, λ, seed, samplers, points and digest."""
    rows = [[c.name, MODE_LABEL[c.mode], budget_label(c.budget) if c.mode != "base" else "—",
             "—" if c.seed is None else str(c.seed), ", ".join(sorted({s for _, s in c.table.points})),
             str(len(c.table.points)), c.sha256[:12]] for c in curves]
    return markdown_table(["curve table", "arm", "λ", "seed", "samplers", "points", "sha256"], rows, ["l"] * 7)

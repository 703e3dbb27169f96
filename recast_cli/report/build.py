"""The report in memory: its Markdown, section by section, and its figures (nothing is written here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recast_cli.report.figures import (
    Figure,
    figure_d_curves_by_policy,
    figure_links,
    figure_training_curves,
    figures_samples,
    figures_weights,
)
from recast_cli.report.inputs import AGGREGATE, Inputs
from recast_cli.report.statistics import Grid
from recast_cli.report.tables import (
    judge_columns,
    table_aggregate_per_budget,
    table_arm_stalls,
    table_gains,
    table_inputs,
    table_judge,
    table_per_budget,
    table_pooled,
    table_run_stalls,
)


@dataclass(frozen=True)
class Report:
    """A report's Markdown and its figures."""

    markdown: str
    figures: tuple[Figure, ...]


def build_report(inputs: Inputs, prompts: int = 4) -> Report:
    """The Markdown and the PNGs, in memory (checked inputs; nothing is written here)."""
    grid = Grid(inputs.evals)
    parts = ["# ReCAST report\n"]
    parts.append(_header(inputs, grid))
    parts.append("## Inputs\n\n" + table_inputs(inputs))
    notes: list[str] = []
    figures: list[Figure] = []

    if grid.cells:
        seeds = sorted({s for (_, _, s) in grid.cells}, key=lambda s: (s is None, s))
        scope = f"{len(grid.budgets)} budgets × {len(seeds)} seeds, {len(grid.matched())} matched (λ, seed) pairs"
        parts.append(f"## Table 1 — training rewards ({scope})\n")
        parts.append("Each seed's value is the mean over its evaluation's images, averaged over the budgets it was "
                     "evaluated at; entries are the mean ± std over seeds. Aggregate r = Σ_i λ_i·r_i with the integer "
                     "λ of each budget (base: averaged over the same budgets). Bold: the better of static and ReCAST "
                     "at the shown precision. ReCAST wins: matched (λ, seed) pairs where ReCAST's mean is higher.\n")
        parts.append(table_pooled(grid, [AGGREGATE, *grid.rewards], "training reward"))
        if grid.judges:
            parts.append(f"## Table 2 — held-out judges ({scope})\n")
            parts.append(table_pooled(grid, grid.judges, "held-out judge"))
        if grid.dropped_judges:
            notes.append("judges not in every evaluation, left out of the tables: " + ", ".join(grid.dropped_judges))
        notes += [f"incomplete grid: no evaluation of {m}" for m in grid.missing()]

    if inputs.judgements:
        columns, criteria = judge_columns(inputs.judgements, inputs.evals)
        parts.append("## Table 3 — pairwise judge, ReCAST vs static\n")
        parts.append("ReCAST's win rate (wins + ½·ties over all verdicts), every pair judged in both presentation "
                     "orders (position-debiased); 0.5 is parity.\n")
        parts.append(table_judge(columns, criteria))

    if grid.cells:
        parts.append("## Table 4 — aggregate training reward per budget\n")
        parts.append(table_aggregate_per_budget(grid))
        parts.append("## Tables 7/8 — training rewards per budget\n")
        parts.append("Pareto: ReCAST vs static over the per-reward means (not the aggregate).\n")
        parts.append(table_per_budget(grid, grid.rewards, with_aggregate=True))
        if grid.judges:
            parts.append("## Tables 9/10 — held-out judges per budget\n")
            parts.append(table_per_budget(grid, grid.judges, with_aggregate=False))

    figures += figures_weights(inputs.runs)
    curves = figure_training_curves(inputs.runs)
    if curves is not None:
        figures.append(curves)
    samples, sample_notes = figures_samples(inputs.evals, prompts)
    figures += samples
    notes += sample_notes

    if inputs.gains:
        parts.append("## Table 6 — total discriminability gain before and after training\n")
        parts.append("Σ_t ΔD_{i,t} (= D_{i,0}, E5): the divergence left between each policy and the reward's "
                     "positive distribution; remaining = trained / base.\n")
        parts.append(table_gains(inputs.gains))
        figures.append(figure_d_curves_by_policy(inputs.gains))

    if any(r.stalls is not None for r in inputs.runs):
        parts.append("## Stalled rewards in training\n")
        parts.append("From each run's metrics: the steps where `recast train`'s stall detector flagged a reward (its "
                     "smoothed mean made no progress over the window while another reward's rose; docs/train.md, "
                     "\"Stalled rewards\"). Not recorded: a run of an older recast or with `stall_detector = false`.\n")
        parts.append(table_run_stalls(inputs.runs))
        parts.append(table_arm_stalls(inputs.runs))

    if figures:
        parts.append("## Figures\n")
        parts.append(figure_links(figures))
    if notes:
        parts.append("## Notes\n")
        parts.append("".join(f"* {n}\n" for n in notes))
    return Report("\n".join(parts), tuple(figures))


def _header(inputs: Inputs, grid: Grid) -> str:
    lines = []
    settings = [e.table.meta["setting"]["name"] for e in inputs.evals] + [Path(r.setting).stem for r in inputs.runs]
    if settings:
        lines.append(f"Setting `{settings[0]}`.")
    if grid.rewards:
        lines.append("Training rewards: " + ", ".join(grid.rewards) + "; held-out judges: "
                     + (", ".join(grid.judges) or "none") + ".")
    if inputs.evals:
        e = inputs.evals[0]
        s = e.table.meta["sampling"]
        prompts = len({im.prompt_id for im in e.table.images})
        lines.append(f"Evaluations: {prompts} prompts × {s.get('n')} images, ODE sampling with {s.get('steps')} steps, "
                     f"CFG {s.get('guidance_scale')}, resolution {s.get('resolution')}, seed {s.get('seed')}.")
    lines.append("Standard deviations are sample standard deviations (ddof 1) over training seeds.")
    return "\n".join(lines) + "\n"


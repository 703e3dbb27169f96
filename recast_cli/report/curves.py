"""The 1-D world's report: the two-timescale study's endpoints from ``recast.curve/1`` tables.

What is computed was fixed before the study ran (docs/results/twoscale/preregistration.md):

* **Primary endpoint** of a run: the area under its aggregate-reward curve Σ_i λ_i·r_i under
  the training sampler (SDE), as the mean over its evaluated checkpoints (evenly spaced, so
  the mean is the area up to a constant). Per seed, the mean over the budgets λ.
* **Secondary endpoint**: the aggregate at the last checkpoint under the ODE sampler.
* **Contrasts**: arm − static per seed (paired: every arm of one seed shares its noise), with
  the mean, the sample sd, the 95% t-interval and the two-sided sign test over seeds.
"""

from __future__ import annotations

from recast_cli.report.build import Report
from recast_cli.report.figures import figure_curves, figure_links, figures_curve_weights
from recast_cli.report.inputs import MODE_LABEL, ARM_ORDER, CurveInputs, budget_label
from recast_cli.report.statistics import contrasts, endpoint_grid, primary, secondary
from recast_cli.report.tables import table_arms, table_contrasts, table_curve_inputs, table_final_rewards


def build_curve_report(inputs: CurveInputs) -> Report:
    """The Markdown and the PNGs of the 1-D world, in memory."""
    curves = inputs.curves
    meta = curves[0].table.meta
    first = next(c for c in curves)
    seeds = sorted({c.seed for c in curves if c.mode != "base"})
    budgets = sorted({c.budget for c in curves if c.mode != "base"})
    arms = [m for m in ARM_ORDER if any(c.mode == m for c in curves)]
    parts = ["# ReCAST report — the 1-D world\n",
             f"Setting `{meta['setting']['name']}`; rewards {', '.join(first.table.scorers[:-1])}; arms "
             f"{', '.join(MODE_LABEL[m] for m in arms)}; budgets {', '.join(budget_label(b) for b in budgets)}; "
             f"{len(seeds)} seeds; n = {first.table.n} samples per evaluated point, the same seeds everywhere.\n"]
    notes: list[str] = []
    step_sets = {tuple(sorted(s for s, k in c.table.points if k == "sde")) for c in curves
                 if c.mode != "base" and any(k == "sde" for _, k in c.table.points)}
    if len(step_sets) > 1:
        notes.append("the runs' curves hold different checkpoints: " + "; ".join(
            ", ".join(map(str, s)) for s in sorted(step_sets)) + " (e.g. keep_checkpoints below max_steps/save_every)")
    for title, endpoint, what in (
            ("Primary endpoint — area under the aggregate-reward curve (SDE)", primary,
             "A run's value is the mean of Σ_i λ_i·r_i over its evaluated checkpoints under the training sampler."),
            ("Secondary endpoint — final aggregate reward (ODE)", secondary,
             "A run's value is Σ_i λ_i·r_i at its last checkpoint under the deterministic ODE sampler.")):
        grid = endpoint_grid(curves, endpoint)
        if not grid:
            continue
        parts.append(f"## {title}\n")
        parts.append(what + " Mean ± sd over seeds per budget:\n")
        parts.append(table_arms(grid))
        items, more = contrasts(grid)
        notes += more
        if items:
            parts.append("Paired per seed (each seed's difference averaged over the budgets), 95% t-interval and the "
                         "two-sided sign test over seeds (ties dropped):\n")
            parts.append(table_contrasts(items))
    parts.append("## Per-reward means at the last checkpoint (SDE)\n")
    parts.append(table_final_rewards(curves))
    figures = [figure_curves(curves), *figures_curve_weights(inputs.runs, inputs.gains, inputs.weights)]
    parts.append("## Figures\n")
    parts.append(figure_links(figures))
    parts.append("## Inputs\n")
    parts.append(table_curve_inputs(curves))
    if notes:
        parts.append("## Notes\n")
        parts.append("".join(f"* {n}\n" for n in notes))
    return Report("\n".join(parts), tuple(figures))

"""``recast report`` in the 1-D world: the two-timescale study's endpoints from ``recast.curve/1`` tables.

Inputs, any mix: curve tables (``recast evaluate`` on flow1d runs and the base policy), run
folders (their W), gain tables (the exact and the sampled gains) and W files (ReCAST's W from
the sampled gains, shown beside the exact one). What is computed, fixed before the study ran
(docs/results/twoscale/preregistration.md):

* **Primary endpoint** of a run: the area under its aggregate-reward curve Σ_i λ_i·r_i under
  the training sampler (SDE), as the mean over its evaluated checkpoints (evenly spaced, so
  the mean is the area up to a constant). Per seed, the mean over the budgets λ.
* **Secondary endpoint**: the aggregate at the last checkpoint under the ODE sampler.
* **Contrasts**: arm − static per seed (paired: every arm of one seed shares its noise), with
  the mean, the sample sd, the 95% t-interval and the two-sided sign test over seeds.

``report.md`` depends only on the artifacts' contents, so regenerating it gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts import (
    CURVE_SCHEMA,
    GAINS_SCHEMA,
    WEIGHTS_SCHEMA,
    CurveTable,
    GainTable,
    WeightMatrix,
    artifact_schema,
    read_curve,
    read_gains,
    read_weights,
    sha256_file,
)
from recast_cli.errors import BadInput
from recast_cli.report import (
    MODE_LABEL,
    REPORT_NAME,
    TRAINED,
    Evaluated,
    Figure,
    Report,
    _render,
    budget_label,
    budget_slug,
    fixed,
    markdown_table,
    write_report,
)

Budget = tuple[float, ...]
CONTRASTS = ("recast", "reversed", "nosink")


@dataclass(frozen=True)
class Curve(Evaluated):
    """One ``recast.curve/1`` table and what it evaluated (mode, λ, training seed)."""

    name: str
    table: CurveTable
    sha256: str


@dataclass
class CurveInputs:
    curves: list[Curve]
    runs: list[Path]
    gains: list[tuple[str, GainTable]]
    weights: list[tuple[str, WeightMatrix]]


def is_curve_input(paths: Sequence[str | Path]) -> bool:
    """True when the inputs hold a ``recast.curve/1`` table: the report of the 1-D world."""
    for p in map(Path, paths):
        if p.is_file():
            try:
                if artifact_schema(p)[0] == CURVE_SCHEMA:
                    return True
            except BadInput:
                continue
    return False


def load_curve_inputs(paths: Sequence[str | Path]) -> CurveInputs:
    inputs = CurveInputs([], [], [], [])
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise BadInput(f"{p}: no such file or folder")
        if p.resolve() in seen:
            raise BadInput(f"{p} is given twice")
        seen.add(p.resolve())
        if p.is_dir():
            if not (p / "run.json").is_file():
                raise BadInput(f"{p}: a folder without run.json; the 1-D report reads curve, gain and weight files "
                               "and run folders")
            inputs.runs.append(p)
            continue
        tag = artifact_schema(p)[0]
        if tag == CURVE_SCHEMA:
            inputs.curves.append(Curve(p.name, read_curve(p), sha256_file(p)))
        elif tag == GAINS_SCHEMA:
            inputs.gains.append((p.name, read_gains(p)))
        elif tag == WEIGHTS_SCHEMA:
            inputs.weights.append((p.name, read_weights(p)))
        else:
            raise BadInput(f"{p}: an input of kind {tag or 'unknown'}; the 1-D report reads recast.curve/1, "
                           "recast.gains/1 and recast.weights/1 files and recast.run/1 folders")
    if not inputs.curves:
        raise BadInput("no recast.curve/1 table among the inputs")
    keys = [(c.mode, c.budget, c.seed, tuple(c.table.points)) for c in inputs.curves]
    if len(set(keys)) != len(keys):
        raise BadInput("two curve tables evaluate the same run at the same points")
    inputs.curves.sort(key=lambda c: (("base", *TRAINED).index(c.mode), c.budget, c.seed or 0, c.name))
    inputs.runs.sort()
    inputs.gains.sort(key=lambda g: g[0])
    inputs.weights.sort(key=lambda w: w[0])
    return inputs


# --------------------------------------------------------------------------- endpoints


def primary(curve: CurveTable) -> float | None:
    """Mean aggregate over the run's SDE checkpoints (None when it has none)."""
    values = [curve.mean[k, -1] for k, (step, sampler) in enumerate(curve.points) if sampler == "sde" and step > 0]
    return float(np.mean(values)) if values else None


def secondary(curve: CurveTable) -> float | None:
    """The aggregate at the run's last ODE point (None when it has none)."""
    odes = [(step, k) for k, (step, sampler) in enumerate(curve.points) if sampler == "ode" and step > 0]
    return float(curve.mean[max(odes)[1], -1]) if odes else None


def endpoint_grid(curves: Sequence[Curve], endpoint) -> dict[tuple[str, Budget, int], float]:
    """(mode, λ, seed) → the endpoint of that run (the curve tables of one run are merged)."""
    grid: dict[tuple[str, Budget, int], float] = {}
    for c in curves:
        if c.mode == "base":
            continue
        value = endpoint(c.table)
        if value is not None:
            key = (c.mode, c.budget, int(c.seed))
            if key in grid:
                raise BadInput(f"{c.name}: a second table with this endpoint for {MODE_LABEL[c.mode]} "
                               f"λ = {budget_label(c.budget)} seed {c.seed}")
            grid[key] = value
    return grid


@dataclass(frozen=True)
class Contrast:
    mode: str
    diffs: np.ndarray  # per seed

    def row(self, decimals: int = 4) -> list[str]:
        from scipy import stats

        d = self.diffs
        n = len(d)
        mean = float(d.mean())
        if n > 1:
            sd = float(d.std(ddof=1))
            half = float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))
            interval = f"[{fixed(mean - half, decimals)}, {fixed(mean + half, decimals)}]"
        else:
            sd, interval = float("nan"), "—"
        wins, losses = int((d > 0).sum()), int((d < 0).sum())
        p = stats.binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else float("nan")
        return [f"{MODE_LABEL[self.mode]} − static", str(n), fixed(mean, decimals),
                "—" if math.isnan(sd) else fixed(sd, decimals), interval, f"{wins}/{losses}",
                "—" if math.isnan(p) else f"{p:.3f}"]


def contrasts(grid: dict[tuple[str, Budget, int], float]) -> tuple[list[Contrast], list[str]]:
    """Arm − static per seed, each seed's value the mean over the budgets both arms have."""
    budgets = sorted({b for (_, b, _) in grid})
    out, notes = [], []
    for mode in CONTRASTS:
        seeds = sorted({s for (m, _, s) in grid if m == mode})
        diffs = []
        for s in seeds:
            shared = [b for b in budgets if (mode, b, s) in grid and ("static", b, s) in grid]
            if len(shared) < len(budgets):
                notes.append(f"{MODE_LABEL[mode]} seed {s}: {len(shared)} of {len(budgets)} budgets paired with static")
            if shared:
                diffs.append(np.mean([grid[(mode, b, s)] - grid[("static", b, s)] for b in shared]))
        if diffs:
            out.append(Contrast(mode, np.array(diffs)))
    return out, notes


def table_contrasts(items: Sequence[Contrast]) -> str:
    header = ["contrast", "seeds", "mean", "sd", "95% t-interval", "ahead/behind", "sign test p"]
    return markdown_table(header, [c.row() for c in items])


def table_arms(grid: dict[tuple[str, Budget, int], float]) -> str:
    budgets = sorted({b for (_, b, _) in grid})
    modes = [m for m in TRAINED if any(k[0] == m for k in grid)]
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
    for (mode, budget), values in sorted(by.items(), key=lambda kv: (("base", *TRAINED).index(kv[0][0]), kv[0][1])):
        arr = np.array(values)
        rows.append([MODE_LABEL[mode], budget_label(budget) if budget else "—", str(len(values)),
                     *(fixed(v, 4) for v in arr.mean(axis=0))])
    return markdown_table(["arm", "λ", "seeds", *rewards], rows)


# --------------------------------------------------------------------------- figures


def figure_curves(curves: Sequence[Curve]) -> Figure:
    """Aggregate (SDE) against training step per λ and arm: mean over seeds, band ± sd."""
    base = [c for c in curves if c.mode == "base"]
    base_value = None
    if base and (0, "sde") in base[0].table.points:
        base_value = base[0].table  # its aggregate depends on λ: recomputed per budget below
    budgets = sorted({c.budget for c in curves if c.mode != "base"})

    def draw() -> Any:
        import matplotlib.pyplot as plt

        cols = min(len(budgets), 3)
        fig, axes = plt.subplots(1, cols, figsize=(4.6 * cols, 3.6), squeeze=False)
        for ax, budget in zip(axes.ravel(), budgets):
            for mode in TRAINED:
                runs = [c.table for c in curves if c.mode == mode and c.budget == budget]
                series = []
                for t in runs:
                    pts = sorted((step, t.mean[k, -1]) for k, (step, s) in enumerate(t.points) if s == "sde")
                    if pts:
                        series.append(pts)
                if not series:
                    continue
                steps = [s for s, _ in series[0]]
                values = np.array([[v for _, v in pts] for pts in series if [s for s, _ in pts] == steps])
                if base_value is not None:
                    b = base_value.mean[base_value.points.index((0, "sde")), :-1] @ np.asarray(budget)
                    steps, values = [0, *steps], np.concatenate([np.full((len(values), 1), b), values], axis=1)
                mean = values.mean(axis=0)
                (line,) = ax.plot(steps, mean, lw=1.4, label=f"{MODE_LABEL[mode]} ({len(values)} seeds)")
                if len(values) > 1:
                    sd = values.std(axis=0, ddof=1)
                    ax.fill_between(steps, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, lw=0)
            ax.set_title(f"λ = {budget_label(budget)}")
            ax.set_xlabel("training step")
            ax.set_ylabel("aggregate Σλ·r (SDE, held-out seeds)")
            ax.grid(alpha=0.3)
            ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return fig

    return Figure("curves.png", "Aggregate reward Σ_i λ_i·r_i of every checkpoint under the training sampler "
                                "(the same evaluation seeds for every run), mean over seeds, band ± sd; step 0 is "
                                "the exact base policy.", _render(draw))


def figure_weights(runs: Sequence[Path], gains: Sequence[tuple[str, GainTable]],
                   shown: Sequence[tuple[str, WeightMatrix]]) -> list[Figure]:
    """Per λ: the exact gains, then T'·W of every arm (and of ReCAST from the sampled gains)."""
    found: dict[Budget, dict[str, WeightMatrix]] = {}
    for run in runs:
        path = run / "weights.safetensors"
        if path.is_file():
            w = read_weights(path)
            found.setdefault(tuple(w.lam), {}).setdefault(w.mode, w)
    for name, w in shown:
        found.setdefault(tuple(w.lam), {})[f"{w.mode} (sampled gains)"] = w
    exact = next((g for n, g in gains if g.meta.get("sampling") == "exact"), None)
    figures = []
    for budget, by_mode in sorted(found.items()):
        order = [m for m in (*TRAINED, "recast (sampled gains)") if m in by_mode]

        def draw(by_mode=by_mode, order=order, budget=budget) -> Any:
            import matplotlib.pyplot as plt

            panels = len(order) + (exact is not None)
            fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 3.2), squeeze=False)
            axes = list(axes.ravel())
            if exact is not None:
                ax = axes.pop(0)
                x = np.arange(1, exact.T + 1) / exact.T
                for i, r in enumerate(exact.rewards):
                    ax.plot(x, exact.gain[i], marker="o", ms=2, lw=1.2, label=r)
                ax.set_title("exact gain ΔD$_{i,t}$")
                ax.set_xlabel("t / T (clean → noisy)")
                ax.legend(frameon=False, fontsize=8)
                ax.grid(alpha=0.3)
            top = max(float((by_mode[m].W * len(by_mode[m].steps)).max()) for m in order)
            for ax, mode in zip(axes, order):
                w = by_mode[mode]
                Tp = len(w.steps)
                image = ax.imshow(w.W * Tp, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0, vmax=top,
                                  extent=(0.5 / w.T, (w.T + 0.5) / w.T, w.m - 0.5, -0.5))
                ax.set_yticks(range(w.m), labels=list(w.rewards))
                ax.set_xlabel("t / T (clean → noisy)")
                label = MODE_LABEL.get(mode, mode.replace("recast", "ReCAST"))
                ax.set_title(f"{label}: T'·W")
            fig.colorbar(image, ax=axes[-1], label="T'·W$_{i,t}$ (one scale for every panel)")
            fig.suptitle(f"λ = {budget_label(budget)}")
            fig.tight_layout()
            return fig

        figures.append(Figure(f"weights-lambda-{budget_slug(budget)}.png",
                              f"λ = {budget_label(budget)}: the exact per-step gains and T'·W of every arm "
                              "(reversed: ReCAST's columns mirrored; sampled: ReCAST solved from the sampled "
                              "estimator's gains instead of the exact ones).", _render(draw)))
    return figures


# --------------------------------------------------------------------------- the report


def build_curve_report(inputs: CurveInputs) -> Report:
    curves = inputs.curves
    meta = curves[0].table.meta
    first = next(c for c in curves)
    seeds = sorted({c.seed for c in curves if c.mode != "base"})
    budgets = sorted({c.budget for c in curves if c.mode != "base"})
    arms = [m for m in TRAINED if any(c.mode == m for c in curves)]
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
    figures = [figure_curves(curves), *figure_weights(inputs.runs, inputs.gains, inputs.weights)]
    parts.append("## Figures\n")
    parts.append("\n".join(f"![{f.file}]({f.file})\n\n{f.caption}\n" for f in figures))
    rows = [[c.name, MODE_LABEL[c.mode], budget_label(c.budget) if c.mode != "base" else "—",
             "—" if c.seed is None else str(c.seed), ", ".join(sorted({s for _, s in c.table.points})),
             str(len(c.table.points)), c.sha256[:12]] for c in curves]
    parts.append("## Inputs\n")
    parts.append(markdown_table(["curve table", "arm", "λ", "seed", "samplers", "points", "sha256"], rows,
                                ["l"] * 7))
    if notes:
        parts.append("## Notes\n")
        parts.append("".join(f"* {n}\n" for n in notes))
    return Report("\n".join(parts), tuple(figures))


def make_curve_report(paths: Sequence[str | Path], out: Path) -> list[Path]:
    inputs = load_curve_inputs(paths)
    return write_report(build_curve_report(inputs), out)


__all__ = ["REPORT_NAME", "is_curve_input", "make_curve_report"]

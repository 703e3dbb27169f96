"""Every figure recast draws: Fig. 1, the D curves and Fig. 5, training and evaluation curves, sample grids.

The x-axis of the gain and W panels is t/T, clean data on the left (t/T → 0) and pure noise on
the right (t/T = 1), so grids of different T line up. The report's figures are PNG bytes drawn
under fixed rcParams and saved without metadata that changes between runs.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from recast_cli.artifacts import FIGURE_SCHEMA, PNG_SCHEMA_KEY, GainTable, WeightMatrix, atomic_write_bytes
from recast_cli.errors import BadInput
from recast_cli.report.inputs import (
    MODE_LABEL,
    MODE_ORDER,
    ARM_ORDER,
    Budget,
    Curve,
    Evaluation,
    Gains,
    Run,
    budget_label,
    budget_slug,
    sort_gains,
)
from recast_cli.solve.sinkhorn import indiscriminable_rows, mean_normalised_gain, solve_weights

if TYPE_CHECKING:
    import matplotlib.figure


def _pyplot() -> Any:
    """pyplot on the Agg backend, imported on first use (the CLI starts without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------- Fig. 1 and one table's D curves


def _step_positions(steps: int) -> np.ndarray:
    return np.arange(1, steps + 1) / steps


def figure_gains_weights(rewards: Sequence[str], gain: np.ndarray, normalised_gain: np.ndarray, W: np.ndarray,
                         title: str, w_label: str,
                         band: tuple[np.ndarray, np.ndarray] | None = None) -> matplotlib.figure.Figure:
    """Three panels: ΔD_{i,t} (E5), ΔD̄_{i,t} (E10), and W (E12) as a reward x t/T heatmap; with W's bootstrap
    ``band`` (its 5 % and 95 % points per entry) a fourth: each reward's row T·W_i with its band, beside static's."""
    panels, ratios = (4, [1, 1, 1.25, 1.1]) if band is not None else (3, [1, 1, 1.25])
    fig, axes = _pyplot().subplots(1, panels, figsize=(5 * panels, 4.2), gridspec_kw={"width_ratios": ratios})
    x_gain = _step_positions(gain.shape[1])
    for i, name in enumerate(rewards):
        axes[0].plot(x_gain, gain[i], marker="o", ms=3, lw=1.4, label=name)
        axes[1].plot(x_gain, normalised_gain[i], marker="o", ms=3, lw=1.4, label=name)
    axes[0].set_title("per-step gain ΔD$_{i,t}$")
    axes[1].set_title("mean-normalised gain ΔD̄$_{i,t}$")
    axes[1].axhline(1.0, color="0.6", lw=0.8, ls="--")
    for ax in axes[:2]:
        ax.set_xlim(0, 1)
        ax.set_xlabel("t / T   (clean → noisy)")
        ax.grid(alpha=0.3)
    axes[0].legend(frameon=False, fontsize=9)

    steps = W.shape[1]
    image = axes[2].imshow(W * steps, aspect="auto", cmap="viridis", interpolation="nearest",
                           extent=(0.5 / steps, (steps + 0.5) / steps, len(rewards) - 0.5, -0.5))
    axes[2].set_yticks(range(len(rewards)), labels=list(rewards))
    axes[2].set_xlim(0, 1 + 0.5 / steps)
    axes[2].set_xlabel("t / T   (clean → noisy)")
    axes[2].set_title(w_label)
    fig.colorbar(image, ax=axes[2], label="T · W$_{i,t}$")
    if band is not None:
        x = _step_positions(steps)
        trained = max(int((W.sum(axis=0) > 0).sum()), 1)
        for i, name in enumerate(rewards):
            line, = axes[3].plot(x, W[i] * steps, lw=1.4, label=name)
            axes[3].fill_between(x, band[0][i] * steps, band[1][i] * steps, color=line.get_color(), alpha=0.2, lw=0)
            axes[3].axhline(W[i].sum() * steps / trained, color=line.get_color(), lw=0.8, ls="--")  # static: λ̂_i/T'
        axes[3].set_xlim(0, 1)
        axes[3].set_xlabel("t / T   (clean → noisy)")
        axes[3].set_title("T·W$_{i,t}$, 90% bootstrap band (dashed: static)")
        axes[3].grid(alpha=0.3)
        axes[3].legend(frameon=False, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_figure(fig: matplotlib.figure.Figure, path: str | os.PathLike[str]) -> None:
    """Write a PNG atomically, without the matplotlib version stamp (so reruns are byte-identical),
    tagged as recast's figure (so a later --out may replace it and nothing else)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": None, PNG_SCHEMA_KEY: FIGURE_SCHEMA})
    _pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())


def figure_from_artifacts(gains: GainTable | None = None, weights: WeightMatrix | None = None,
                          title: str = "ReCAST credit assignment") -> matplotlib.figure.Figure:
    """Fig. 1 from a gain table, a weight matrix, or both.

    Gains come from the gain table when given, else from the gains stored with W. W comes
    from the weight matrix when given, else it is solved with uniform λ (mode recast, τ = 1)
    and the panel says so.
    """
    if gains is None and weights is None:
        raise ValueError("need a gain table or a weight matrix")
    if gains is not None:
        rewards, gain = gains.rewards, gains.gain
        low = indiscriminable_rows(gain)
    else:
        rewards, gain = weights.rewards, weights.gain
        low = np.array([r in weights.info.get("indiscriminable", []) for r in rewards])
    if weights is not None:
        if weights.rewards != tuple(rewards):
            raise BadInput(f"the weight matrix has rewards {list(weights.rewards)}, the gain table {list(rewards)}")
        W = weights.W
        w_label = f"W ({weights.mode}, λ = {', '.join(f'{x:g}' for x in weights.lam)}, τ = {weights.tau:g})"
    else:
        W = solve_weights(gain, np.ones(len(rewards))).W
        w_label = "W (recast, uniform λ, τ = 1)"
    band = weights.band if weights is not None else None
    return figure_gains_weights(rewards, gain, mean_normalised_gain(gain, low), W, title, w_label, band=band)


def figure_d_curves(gains: GainTable, title: str = "cumulative discriminability") -> matplotlib.figure.Figure:
    """D_{i,t} (E4) per reward against t/T, with the bootstrap band [D_lo, D_hi] where the table has one."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 4.2))
    x = np.arange(gains.T + 1) / gains.T
    for i, name in enumerate(gains.rewards):
        (line,) = ax.plot(x, gains.D[i], marker="o", ms=3, lw=1.4, label=name)
        if gains.D_lo is not None and gains.D_hi is not None:
            ax.fill_between(x, gains.D_lo[i], gains.D_hi[i], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlim(0, 1)
    ax.set_xlabel("t / T   (clean → noisy)")
    ax.set_ylabel("D$_{i,t}$ (shifted, D$_T$ = 0)")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=9)
    band = " with 95% bootstrap bands" if gains.D_lo is not None else ""
    ax.set_title(f"{title}{band} (α = {gains.meta.get('alpha')})")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- the report's figures


@dataclass(frozen=True)
class Figure:
    """One of the report's figures: its file name, its caption and the PNG's bytes."""

    file: str
    caption: str
    png: bytes


def figure_links(figures: Sequence[Figure]) -> str:
    """The Markdown that shows every figure above its caption."""
    return "\n".join(f"![{f.file}]({f.file})\n\n{f.caption}\n" for f in figures)


def _render(draw: Callable[[], Any]) -> bytes:
    """Draw under fixed rcParams and save without metadata that changes between runs (dates, versions)."""
    import matplotlib

    plt = _pyplot()
    with matplotlib.rc_context({"font.family": "DejaVu Sans", "font.size": 9, "figure.dpi": 100,
                                "savefig.dpi": 110, "path.simplify": True, "svg.hashsalt": "recast",
                                "axes.prop_cycle": matplotlib.rcParamsDefault["axes.prop_cycle"]}):
        fig = draw()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None, PNG_SCHEMA_KEY: FIGURE_SCHEMA})
        plt.close(fig)
    return buffer.getvalue()


def figures_weights(runs: Sequence[Run]) -> list[Figure]:
    """Fig. 1 for every distinct W of the ReCAST and no-Sink runs (static W are flat)."""
    found: dict[tuple[str, Budget], dict[str, WeightMatrix]] = {}
    for run in runs:
        if run.weights is not None and run.mode in ("recast", "nosink", "reversed"):
            found.setdefault((run.mode, run.budget), {})[_digest(run.weights)] = run.weights
    figures = []
    for (mode, budget), by_key in sorted(found.items(), key=lambda kv: (MODE_ORDER.index(kv[0][0]), kv[0][1])):
        for k, key in enumerate(sorted(by_key)):
            w = by_key[key]
            suffix = f"-{k + 1}" if len(by_key) > 1 else ""
            file = f"fig1-{mode}-lambda-{budget_slug(budget)}{suffix}.png"
            title = f"{MODE_LABEL[mode]} W, λ = {budget_label(budget)}, T = {w.T}"
            png = _render(lambda w=w, title=title: figure_from_artifacts(weights=w, title=title))
            figures.append(Figure(file, f"Fig. 1 — {title}: per-step gain ΔD, mean-normalised gain and W "
                                        "(t/T from clean to noisy).", png))
    return figures


def _digest(w: WeightMatrix) -> str:
    return hashlib.sha256(np.ascontiguousarray(w.W).tobytes() + np.ascontiguousarray(w.gain).tobytes()).hexdigest()


def figure_training_curves(runs: Sequence[Run]) -> Figure | None:
    """Aggregate training reward per step, static vs no-Sink vs ReCAST per λ, mean over seeds (± std band)."""
    with_curves = [r for r in runs if r.curve]
    if not with_curves:
        return None
    budgets = sorted({r.budget for r in with_curves})

    def draw() -> Any:
        plt = _pyplot()

        cols = min(len(budgets), 3)
        rows = math.ceil(len(budgets) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
        for ax, budget in zip(axes.ravel(), budgets):
            for mode in ARM_ORDER:
                curves = [r.curve for r in with_curves if r.budget == budget and r.mode == mode]
                if not curves:
                    continue
                steps = sorted(set.intersection(*(set(c) for c in curves)))
                values = np.array([[c[s] for s in steps] for c in curves])
                mean = values.mean(axis=0)
                (line,) = ax.plot(steps, mean, lw=1.4, label=f"{MODE_LABEL[mode]} ({len(curves)} seeds)")
                if len(curves) > 1:
                    std = values.std(axis=0, ddof=1)
                    ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
            ax.set_title(f"λ = {budget_label(budget)}")
            ax.set_xlabel("training step")
            ax.set_ylabel("aggregate Σλ·r (training batch)")
            ax.grid(alpha=0.3)
            ax.legend(frameon=False, fontsize=8)
        for ax in axes.ravel()[len(budgets):]:
            ax.set_visible(False)
        fig.tight_layout()
        return fig

    return Figure("training-curves.png", "Training curves — aggregate training reward Σ_i λ_i·mean r_i of each "
                                         "step's batch, mean over seeds (band: ± std over seeds).", _render(draw))


def figures_samples(evals: Sequence[Evaluation], prompts: int) -> tuple[list[Figure], list[str]]:
    """Per λ: static (left) and ReCAST (right) images of the same prompts and sampling seeds, lowest training seed."""
    from PIL import Image

    by_key = {(e.mode, e.budget, e.seed): e for e in evals if e.mode in ("static", "recast")}
    figures, notes = [], []
    for budget in sorted({b for (_, b, _) in by_key}):
        seeds = sorted(s for (m, b, s) in by_key if m == "recast" and b == budget and ("static", b, s) in by_key)
        if not seeds or prompts < 1:
            continue
        static, ours = by_key[("static", budget, seeds[0])], by_key[("recast", budget, seeds[0])]
        theirs = {(im.prompt_id, im.seed): im for im in static.table.images}
        common = sorted((im.prompt_id, im.seed) for im in ours.table.images if (im.prompt_id, im.seed) in theirs)
        first = {}
        for prompt_id, seed in common:
            first.setdefault(prompt_id, seed)
        ids = sorted(first)
        if not ids:
            continue
        chosen = sorted({ids[i] for i in np.linspace(0, len(ids) - 1, min(prompts, len(ids))).round().astype(int)})
        ours_images = {(im.prompt_id, im.seed): im for im in ours.table.images}
        picks = [(theirs[(p, first[p])], ours_images[(p, first[p])]) for p in chosen]
        try:
            pixels = [tuple(np.asarray(Image.open(e.path.parent / im.image_path).convert("RGB"))
                            for e, im in ((static, a), (ours, b))) for a, b in picks]
        except (OSError, ValueError) as exc:  # a missing or unreadable image leaves this grid out, not the report
            notes.append(f"no sample grid for λ = {budget_label(budget)}: {type(exc).__name__} reading the images "
                         f"of {static.name} / {ours.name}")
            continue

        def draw(picks: Any = picks, pixels: Any = pixels) -> Any:
            import textwrap

            plt = _pyplot()

            fig, axes = plt.subplots(len(picks), 2, figsize=(5.2, 2.5 * len(picks)), squeeze=False)
            for r, ((im, _), images) in enumerate(zip(picks, pixels)):
                for c, image in enumerate(images):
                    ax = axes[r, c]
                    ax.imshow(image, interpolation="nearest")
                    ax.set_xticks([])
                    ax.set_yticks([])
                    if r == 0:
                        ax.set_title(("static", "ReCAST")[c])
                axes[r, 0].set_ylabel(textwrap.fill(im.prompt[:90], 26), fontsize=7)
            fig.tight_layout()
            return fig

        caption = (f"Samples, λ = {budget_label(budget)}, training seed {seeds[0]}: static (left) vs ReCAST (right), "
                   "the same prompt and sampling seed per row (prompts " + ", ".join(str(p) for p in chosen) + ").")
        figures.append(Figure(f"samples-lambda-{budget_slug(budget)}.png", caption, _render(draw)))
    return figures, notes


def figure_d_curves_by_policy(gains: Sequence[Gains]) -> Figure:
    """Fig. 5: D_{i,t} per reward at the base policy and at the trained checkpoints, on one vertical axis."""
    ordered = sort_gains(gains)

    def draw() -> Any:
        plt = _pyplot()

        fig, axes = plt.subplots(1, len(ordered), figsize=(5.0 * len(ordered), 3.8), sharey=True, squeeze=False)
        for ax, g in zip(axes[0], ordered):
            x = np.arange(g.table.T + 1) / g.table.T
            for i, reward in enumerate(g.table.rewards):
                ax.plot(x, g.table.D[i], marker="o", ms=2.5, lw=1.3, label=reward)
            ax.set_title(g.label)
            ax.set_xlim(0, 1)
            ax.set_xlabel("t / T   (clean → noisy)")
            ax.axhline(0.0, color="0.6", lw=0.8)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("D$_{i,t}$ (D$_T$ = 0)")
        axes[0][0].legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return fig

    return Figure("fig5-d-curves.png", "Fig. 5 — cumulative discriminability D_{i,t} at "
                  + ", ".join(g.label for g in ordered) + " (shared vertical axis).", _render(draw))


# --------------------------------------------------------------------------- the 1-D world's figures


def figure_curves(curves: Sequence[Curve]) -> Figure:
    """Aggregate (SDE) against training step per λ and arm: mean over seeds, band ± sd."""
    base = [c for c in curves if c.mode == "base"]
    base_value = None
    if base and (0, "sde") in base[0].table.points:
        base_value = base[0].table  # its aggregate depends on λ: recomputed per budget below
    budgets = sorted({c.budget for c in curves if c.mode != "base"})

    def draw() -> Any:
        plt = _pyplot()

        cols = min(len(budgets), 3)
        fig, axes = plt.subplots(1, cols, figsize=(4.6 * cols, 3.6), squeeze=False)
        for ax, budget in zip(axes.ravel(), budgets):
            for mode in ARM_ORDER:
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


def figures_curve_weights(runs: Sequence[WeightMatrix], gains: Sequence[tuple[str, GainTable]],
                          shown: Sequence[tuple[str, WeightMatrix]]) -> list[Figure]:
    """Per λ: the exact gains, then T'·W of every arm's run (and of ReCAST from the sampled gains)."""
    found: dict[Budget, dict[str, WeightMatrix]] = {}
    for w in runs:
        found.setdefault(tuple(w.lam), {}).setdefault(w.mode, w)
    for name, w in shown:
        found.setdefault(tuple(w.lam), {})[f"{w.mode} (sampled gains)"] = w
    exact = next((g for n, g in gains if g.meta.get("sampling") == "exact"), None)
    figures = []
    for budget, by_mode in sorted(found.items()):
        order = [m for m in (*ARM_ORDER, "recast (sampled gains)") if m in by_mode]

        def draw(by_mode=by_mode, order=order, budget=budget) -> Any:
            plt = _pyplot()

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


"""The paper's Fig. 1: per-step gains, mean-normalised gains and the weight matrix W.

The x-axis is t/T, clean data on the left (t/T → 0) and pure noise on the right (t/T = 1),
the same for all three panels, so grids of different T line up.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from recast_cli.artifacts import GainTable, WeightMatrix, atomic_write_bytes  # noqa: E402
from recast_cli.errors import BadInput  # noqa: E402
from recast_cli.sinkhorn import indiscriminable_rows, mean_normalised_gain, solve_weights  # noqa: E402


def _step_positions(steps: int) -> np.ndarray:
    return np.arange(1, steps + 1) / steps


def figure_gains_weights(rewards: Sequence[str], gain: np.ndarray, normalised_gain: np.ndarray, W: np.ndarray,
                         title: str, w_label: str) -> plt.Figure:
    """Three panels: ΔD_{i,t} (E5), ΔD̄_{i,t} (E10), and W (E12) as a reward x t/T heatmap."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [1, 1, 1.25]})
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
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_figure(fig: plt.Figure, path: str | os.PathLike[str]) -> None:
    """Write a PNG atomically, without the matplotlib version stamp (so reruns are byte-identical)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def figure_from_artifacts(gains: GainTable | None = None, weights: WeightMatrix | None = None,
                          title: str = "ReCAST credit assignment") -> plt.Figure:
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
    return figure_gains_weights(rewards, gain, mean_normalised_gain(gain, low), W, title, w_label)


def figure_d_curves(gains: GainTable, title: str = "cumulative discriminability") -> plt.Figure:
    """D_{i,t} (E4) per reward against t/T, with the bootstrap band [D_lo, D_hi] where the table has one."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
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

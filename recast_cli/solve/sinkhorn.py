"""From per-step gains to the reward x step weight matrix W (docs/method.md §5, E9-E12).

Read top to bottom it is the method: resample the gains to the training grid (E9),
mean-normalise them (E10), take the affinity kernel (E11, or the power kernel E11p), and balance it with Sinkhorn
so that rows sum to λ̂ and columns to 1/T (E12). ``static`` and ``nosink`` are the two
closed-form baselines of the paper's ablation; ``reversed`` (ReCAST's W with its columns in
reverse step order) is a control of the timing alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recast_cli.artifacts import lambda_hat  # the row sums of W, defined with its schema
# the kernels and τ's default, defined with W's schema (which records them)
from recast_cli.artifacts.weights import DEFAULT_TAU
from recast_cli.kernels import DEFAULT_KERNEL, POWER_FLOOR, kernel_of  # noqa: F401 (POWER_FLOOR: re-exported)

DEFAULT_FLOOR = 1e-3
DEFAULT_TOL = 1e-10
SPILL_LEVEL = 0.01


class SinkhornError(RuntimeError):
    """The balancing did not reach the requested marginal error."""


def resample_gains(sigmas: np.ndarray, gain: np.ndarray, new_sigmas: np.ndarray) -> np.ndarray:
    """E9: per-step gains on another σ grid, through the cumulative curve D(σ), never by index.

    The cumulative curve is rebuilt from the non-negative gains and anchored at D(σ_T) = 0,
    ``D_t = Σ_{s>t} ΔD_s``; it is non-increasing, so PCHIP keeps it monotone between the
    nodes. Differencing it on ``new_sigmas`` (σ'_0 … σ'_T', increasing) gives gains that are
    non-negative and, when both grids span [0, σ_T], keep each reward's total D_0.
    Levels noisier than σ_T keep D = 0 (nothing is discriminable past the anchor).
    """
    from scipy.interpolate import PchipInterpolator  # imported here: `recast --help` does not need scipy

    sigmas = np.asarray(sigmas, dtype=np.float64)
    new_sigmas = np.asarray(new_sigmas, dtype=np.float64)
    gain = np.asarray(gain, dtype=np.float64)
    cumulative = np.concatenate([np.cumsum(gain[:, ::-1], axis=1)[:, ::-1], np.zeros((gain.shape[0], 1))], axis=1)
    curve = PchipInterpolator(sigmas, cumulative, axis=1, extrapolate=False)
    new_d = curve(np.clip(new_sigmas, sigmas[0], sigmas[-1]))
    # PCHIP is exactly monotone; rounding can still leave -1e-17 differences.
    return np.maximum(new_d[:, :-1] - new_d[:, 1:], 0.0)


def indiscriminable_rows(gain: np.ndarray, floor: float = DEFAULT_FLOOR, noise: np.ndarray | None = None) -> np.ndarray:
    """E10's floor: rows whose total gain is below ``floor`` x the largest row total, or below ``noise``.

    ``noise`` (per row, optional) is the half-width of the bootstrap interval of D_0.
    """
    totals = gain.sum(axis=1)
    low = totals <= floor * totals.max() if totals.max() > 0 else np.ones(len(totals), dtype=bool)
    if noise is not None:
        low |= totals < noise
    return low


def mean_normalised_gain(gain: np.ndarray, indiscriminable: np.ndarray) -> np.ndarray:
    """E10: ΔD̄_{i,t} = ΔD_{i,t} / ((1/T) Σ_s ΔD_{i,s}); indiscriminable rows become uniform (≡ 1)."""
    gain = np.asarray(gain, dtype=np.float64)
    out = np.ones_like(gain)
    keep = ~indiscriminable
    out[keep] = gain[keep] / gain[keep].mean(axis=1, keepdims=True)
    return out


def log_affinity(normalised_gain: np.ndarray, tau: float = DEFAULT_TAU, kernel: str = DEFAULT_KERNEL) -> np.ndarray:
    """The affinity kernel in the log domain, per reward i and step t: the row ``kernel`` of the kernel
    table (recast_cli/kernels.py; ``exp``, E11: ΔD̄/τ; ``power``, E11p: log(ΔD̄)/τ with ΔD̄ floored at
    :data:`POWER_FLOOR` x its row's peak). Sinkhorn sees K only through cross-ratios, so under E11p a
    row multiplied by a constant gives the same W: E11p reads ratios of gains, E11 their differences
    (docs/method.md §5). An unknown kernel is BadInput."""
    return kernel_of(kernel).log_affinity(np.asarray(normalised_gain, dtype=np.float64), tau)


@dataclass(frozen=True)
class SinkhornResult:
    W: np.ndarray
    iterations: int
    error: float


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    peak = x.max(axis=axis, keepdims=True)
    return (peak + np.log(np.exp(x - peak).sum(axis=axis, keepdims=True))).squeeze(axis)


def marginal_error(W: np.ndarray, row: np.ndarray, col: np.ndarray) -> float:
    """max(|W·1 − row|_∞, |Wᵀ·1 − col|_∞)."""
    return float(max(np.abs(W.sum(axis=1) - row).max(), np.abs(W.sum(axis=0) - col).max()))


def sinkhorn_log(log_kernel: np.ndarray, row: np.ndarray, col: np.ndarray, tol: float = DEFAULT_TOL,
                 max_iter: int = 100_000, absorb_at: float = 1e30) -> SinkhornResult:
    """E12: W = diag(u)·K·diag(v) with W·1 = row and Wᵀ·1 = col, to a marginal error ≤ ``tol``.

    Log-domain stabilised Sinkhorn (Schmitzer 2019): the dual potentials f, g live in the log
    domain and start from one exact log-sum-exp sweep; between absorptions the scalings
    u = e^{Δf}, v = e^{Δg} are iterated on the current plan P = exp(log K + f + g), and are
    absorbed back into f, g whenever they leave [1/absorb_at, absorb_at]. Kernels with any
    dynamic range (narrow gain windows at large T) stay finite, at the cost of plain
    matrix-vector products per iteration. One iteration = one row and one column update.
    """
    row = np.asarray(row, dtype=np.float64)
    col = np.asarray(col, dtype=np.float64)
    f = np.log(row) - _logsumexp(log_kernel, axis=1)
    g = np.log(col) - _logsumexp(log_kernel + f[:, None], axis=0)
    iterations = 0
    while True:
        plan = np.exp(log_kernel + f[:, None] + g[None, :])
        u = np.ones_like(row)
        v = np.ones_like(col)
        while True:
            plan_v = plan @ v
            # Columns are exact after every v-update, so the row error is the marginal error.
            error = float(np.abs(u * plan_v - row).max())
            if error <= tol:
                W = u[:, None] * plan * v[None, :]
                return SinkhornResult(W=W, iterations=iterations, error=marginal_error(W, row, col))
            if iterations >= max_iter:
                raise SinkhornError(f"Sinkhorn did not reach a marginal error of {tol:g} in {max_iter} "
                                    f"iterations (error {error:.3g}); try a larger --tau")
            iterations += 1
            u = row / plan_v
            v = col / (u @ plan)
            if not (np.isfinite(u).all() and np.isfinite(v).all()):
                raise SinkhornError("Sinkhorn scalings overflowed; the kernel is degenerate")
            if max(u.max(), v.max()) > absorb_at or min(u.min(), v.min()) < 1 / absorb_at:
                break
        f += np.log(u)
        g += np.log(v)


def static_weights(lam: np.ndarray, steps: int) -> np.ndarray:
    """The static baseline: W_{i,t} = λ̂_i / T (every step weighs each reward by its budget)."""
    return np.repeat(lambda_hat(lam)[:, None], steps, axis=1) / steps


def nosink_weights(log_kernel: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """The no-Sinkhorn ablation: row marginals only, W_{i,t} = λ̂_i·K_{i,t} / Σ_s K_{i,s}."""
    return lambda_hat(lam)[:, None] * np.exp(log_kernel - _logsumexp(log_kernel, axis=1)[:, None])


def shrunk_weights(W: np.ndarray, lam: np.ndarray, shrink: float) -> np.ndarray:
    """E12s (ours): W pulled toward the static baseline, (1 − γ)·W_static + γ·W with γ = ``shrink`` in (0, 1].

    Both terms have rows λ̂ and (in modes recast and static) columns 1/T', and the marginals are
    linear, so the mix keeps them exactly; γ = 1 is W itself. A candidate for "never worse than
    static": it keeps a share γ of W's timing and spends the rest of each budget evenly.
    """
    if shrink == 1.0:
        return W
    return (1.0 - shrink) * static_weights(lam, W.shape[1]) + shrink * W


def row_shares(W: np.ndarray) -> np.ndarray:
    """Each row of W as a distribution over its steps (the row over its sum; a zero row stays zero)."""
    W = np.asarray(W, dtype=np.float64)
    sums = W.sum(axis=-1, keepdims=True)
    return np.divide(W, sums, out=np.zeros_like(W), where=sums > 0)


def row_tv(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Per row, the total-variation distance between the rows of A and B as distributions over the steps:
    ½·Σ_t |A_{i,t}/Σ_s A_{i,s} − B_{i,t}/Σ_s B_{i,s}|, in [0, 1] (leading axes broadcast)."""
    return 0.5 * np.abs(row_shares(A) - row_shares(B)).sum(axis=-1)


def uncertainty_shrinkage(W: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """E12u's γ_i (ours): the positive-part James–Stein share of reward i's timing that its bootstrap keeps.

    With p̂_i = W_i/λ̂_i (row i as a distribution over the T' trained steps), u = 1/T' (static), the
    draws' rows p_i^b and v_i = mean_b ‖p_i^b − p̂_i‖² (the bootstrap's mean squared error of the row),
    γ_i = max(0, 1 − v_i / ‖p̂_i − u‖²). It is the oracle share ‖p − u‖²/(‖p − u‖² + v) that minimises
    E‖u + γ(p̂ − u) − p‖² for p̂ = p + noise of total variance v, with ‖p − u‖² estimated without bias by
    ‖p̂ − u‖² − v (docs/method.md, E12u). ``W`` [m, T'], ``draws`` [B, m, T'] (trained columns only).
    """
    shares = row_shares(W)
    static = np.full_like(shares, 1.0 / shares.shape[1])
    spread = ((row_shares(draws) - shares[None]) ** 2).sum(axis=-1).mean(axis=0)
    distance = ((shares - static) ** 2).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(distance > 0, 1.0 - spread / distance, 0.0)
    return np.clip(gamma, 0.0, 1.0)


def uncertainty_shrunk_weights(W: np.ndarray, lam: np.ndarray, gamma: np.ndarray, tol: float = DEFAULT_TOL) -> SinkhornResult:
    """E12u (ours): each row of W pulled toward static by its own share, then balanced back to E12's marginals.

    M_i = (1 − γ_i)·λ̂_i/T' + γ_i·W_i keeps every row sum λ̂_i; with unequal γ_i the columns drift from
    1/T', so M is balanced by Sinkhorn (E12 with log K = log M): the result is the matrix with E12's
    marginals closest to M in KL. With every γ_i equal, M is already balanced (E12s) and comes back as is.
    """
    lam_hat = lambda_hat(lam)
    steps = W.shape[1]
    gamma = np.asarray(gamma, dtype=np.float64)[:, None]
    mixed = (1.0 - gamma) * lam_hat[:, None] / steps + gamma * W
    return sinkhorn_log(np.log(np.maximum(mixed, np.finfo(np.float64).tiny)), lam_hat, np.full(steps, 1.0 / steps),
                        tol=tol)


def conflict_static_weights(log_kernel: np.ndarray, lam: np.ndarray, conflict: np.ndarray,
                            tol: float = DEFAULT_TOL) -> SinkhornResult:
    """E12c (ours): the columns where two rewards conflict (E14) keep static weights, the others follow E12.

    ``conflict`` [T'] marks the trained columns C with a detected conflict. W_{i,t} = λ̂_i/T' on C; the
    other columns are E12 on their own kernel with rows λ̂_i·(1 − |C|/T') and columns 1/T', so W keeps
    E12's marginals exactly. No column in conflict: E12 itself; every column: static.
    """
    lam_hat = lambda_hat(lam)
    m, steps = log_kernel.shape
    conflict = np.asarray(conflict, dtype=bool)
    W = np.zeros((m, steps))
    W[:, conflict] = lam_hat[:, None] / steps
    free = ~conflict
    if not free.any():
        return SinkhornResult(W=W, iterations=0, error=marginal_error(W, lam_hat, np.full(steps, 1.0 / steps)))
    share = free.sum() / steps
    result = sinkhorn_log(log_kernel[:, free], lam_hat * share, np.full(int(free.sum()), 1.0 / steps), tol=tol)
    W[:, free] = result.W
    return SinkhornResult(W=W, iterations=result.iterations, error=marginal_error(W, lam_hat, np.full(steps, 1.0 / steps)))


def reversed_weights(W: np.ndarray) -> np.ndarray:
    """The timing control: ReCAST's W with its (trained) columns in reverse step order.

    Row sums (λ̂) and column sums (1/T) are kept and so is every entry, only the step each
    column is spent at is mirrored, clean ↔ noisy: what ReCAST gives a reward at its most
    informative step lands where it is least. If per-reward timing matters, this arm should
    do worse than static; if it does as well as ReCAST, the timing carried no information.
    """
    return np.ascontiguousarray(np.asarray(W, dtype=np.float64)[:, ::-1])


@dataclass(frozen=True)
class Solution:
    """W with what it was solved from and how the solve went."""

    W: np.ndarray
    normalised_gain: np.ndarray
    indiscriminable: np.ndarray
    iterations: int
    error: float


def solve_weights(gain: np.ndarray, lam: np.ndarray, mode: str = "recast", tau: float = DEFAULT_TAU,
                  floor: float = DEFAULT_FLOOR, noise: np.ndarray | None = None,
                  tol: float = DEFAULT_TOL, skip_clean: int = 0, kernel: str = DEFAULT_KERNEL,
                  shrink: float = 1.0) -> Solution:
    """E10-E12 (or a closed-form baseline) for per-step gains ``gain`` [m, T] and budgets ``lam`` [m].

    ``kernel``: ``exp`` (E11) or ``power`` (E11p), for the modes that use a kernel. ``shrink`` = γ < 1
    mixes the solved W with static (E12s, :func:`shrunk_weights`); the marginals still hold.

    ``skip_clean`` = K: the trainer does not train the K cleanest steps t = 1 … K, so they get
    W = 0 and the method runs on the T' = T − K trained columns alone: E10 normalises each row
    over them, E12 balances rows to λ̂ and each trained column to 1/T' (``static``: λ̂/T' on
    every trained step; ``nosink``: row marginals over the trained steps). Every reward thus
    spends its whole budget λ̂_i where the trainer trains.
    """
    gain = np.asarray(gain, dtype=np.float64)
    m, steps = gain.shape
    if not 0 <= skip_clean < steps:
        raise ValueError(f"skip_clean = {skip_clean} must lie in [0, T = {steps})")
    trained = gain[:, skip_clean:]
    low = indiscriminable_rows(trained, floor, noise)
    normalised = np.zeros_like(gain)
    normalised[:, skip_clean:] = mean_normalised_gain(trained, low)
    row = lambda_hat(lam)
    col = np.full(steps - skip_clean, 1.0 / (steps - skip_clean))
    iterations = 0
    if mode == "static":
        sub = static_weights(lam, steps - skip_clean)
        error = marginal_error(sub, row, col)
    elif mode == "nosink":
        sub = nosink_weights(log_affinity(normalised[:, skip_clean:], tau, kernel), lam)
        error = float(np.abs(sub.sum(axis=1) - row).max())
    elif mode in ("recast", "reversed"):
        result = sinkhorn_log(log_affinity(normalised[:, skip_clean:], tau, kernel), row, col, tol=tol)
        sub, iterations, error = result.W, result.iterations, result.error
        if mode == "reversed":
            sub = reversed_weights(sub)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    W = np.zeros_like(gain)
    W[:, skip_clean:] = shrunk_weights(sub, lam, shrink)
    return Solution(W, normalised, low, iterations, error)


def spill_share(W: np.ndarray, gain: np.ndarray, level: float = SPILL_LEVEL) -> np.ndarray:
    """Per reward, the share of its W placed on steps where its gain is below ``level`` x its peak.

    docs/method.md §5: equal column sums force a reward with a narrow informative window to spill
    weight onto steps where it carries ~no information. NaN for a row whose gain is all zero.
    """
    peak = gain.max(axis=1, keepdims=True)
    low = gain < level * peak
    share = (W * low).sum(axis=1) / W.sum(axis=1)
    return np.where(peak[:, 0] > 0, share, np.nan)

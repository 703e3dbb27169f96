"""Rényi gain curves from rollout scores (docs/method.md §2-§4, E3-E8): the cheap half of ``recast estimate``.

Everything here works on the dense score array of a ``recast.scores/1`` table,
``scores[p, n, t, k, i]`` (prompt, sample, step, rollout, reward), so a gain table can be
recomputed for another α, β, projection or bootstrap without a single rollout.

Top to bottom: standardise the rewards per prompt by their std under π^old (§2, §4), estimate log ĥ per sample and step
(E3), turn them into the per-prompt discriminability D̂'_t(c) with π⁺-sampling (E6) or
π^old-sampling (E8), shift by the noisiest step and average over prompts (E7), project onto
non-increasing curves and difference into gains (E5, isotonic or clip), and bootstrap over
prompts for the intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from recast_cli.errors import BadInput

MONOTONE = ("isotonic", "clip")
#: what the bootstrap resamples (``estimate_gains``)
BOOTSTRAP_OVER = ("auto", "prompts", "samples", "both")
#: ``auto`` resamples the prompts from this many prompts up, else each prompt's samples
AUTO_PROMPTS = 10


def bootstrap_unit(over: str, prompts: int) -> str:
    """What ``--bootstrap-over`` resamples for a table of ``prompts`` prompts: ``auto`` → ``prompts`` when there are
    at least AUTO_PROMPTS of them (a bootstrap over fewer is coarse: from 4 prompts, one draw in ten is the
    sample itself), else ``samples``."""
    if over != "auto":
        return over
    return "prompts" if prompts >= AUTO_PROMPTS else "samples"
SAMPLINGS = ("pplus", "pold")
#: The largest log-weight max(α, 1)·|r̃|/β the estimator takes: every log ĥ, its α-multiple and their
#: sums and differences (E3–E8, bootstrap, projection) stay far inside float64 (largest about 1.8e308).
MAX_LOG_WEIGHT = 1e250


def reward_scale(scores: np.ndarray, standardise: bool) -> np.ndarray:
    """s_{p,i}: the std of reward i under π^old for prompt p (docs/method.md §2), or 1 when not standardising.

    The π^old samples are the rollouts from pure noise (t = T): x_T is exact noise under every
    sampling, so those N·K endpoints are exact draws of the policy, unlike the rollouts from
    π⁺-started states at t < T. Only the scale matters: r̃ = (r − mean)/std and r/std differ
    by a per-prompt constant in log h, which the shift E7 removes. A reward that is constant
    over a prompt's π^old draws carries no information there; its scale is set to 1 so r̃
    stays finite.
    """
    P, m = scores.shape[0], scores.shape[-1]
    if not standardise:
        return np.ones((P, m))
    draws = scores[:, :, -1].reshape(P, -1, m)
    std = draws.std(axis=1)
    return np.where(std > 0, std, 1.0)


def log_h(scores: np.ndarray, scale: np.ndarray, beta: float, jackknife: bool = False) -> np.ndarray:
    """E3: log ĥ_{i,t}^n = log mean_k exp(r̃_i(x_0^{n,k,t})/β), as log-sum-exp in float64.

    Shape [P, N, T+1, m]. At t = 0 the sample itself is the endpoint: log ĥ = r̃(x_0^n)/β.
    With ``jackknife`` the K delete-one means are returned instead, shape [P, N, T+1, K, m]
    (t = 0 repeated), for the finite-K bias correction at α ≠ 2.
    """
    z = scores / (scale[:, None, None, None, :] * beta)
    K = scores.shape[3]
    if jackknife:
        if K < 2:
            raise ValueError("the jackknife needs K >= 2")
        body = z[:, :, 1:]
        drops = []
        for j in range(K):
            others = np.delete(body, j, axis=3)
            drops.append(logsumexp(others, axis=3) - np.log(K - 1))
        drop = np.stack(drops, axis=3)
        t0 = np.repeat(z[:, :, :1, :1], K, axis=3)
        return np.concatenate([t0, drop], axis=2)
    out = np.empty(scores.shape[:3] + scores.shape[4:])
    out[:, :, 0] = z[:, :, 0, 0]
    out[:, :, 1:] = logsumexp(z[:, :, 1:], axis=3) - np.log(K)
    return out


def discriminability_pplus(lh: np.ndarray, alpha: float) -> np.ndarray:
    """E6 per prompt: D̂'_{i,t}(c) = 1/(α−1)·log mean_n (ĥ^n)^(α−1); α = 1: mean_n log ĥ^n.

    ``lh`` [P, N, T+1, m] → [P, T+1, m]. The positives x_0^{+,n} are π⁺ samples, so the
    mean over n is an expectation under π⁺_t of (h/Z)^(α−1) up to the constant Z.
    """
    if alpha == 1.0:
        return lh.mean(axis=1)
    n = lh.shape[1]
    return (logsumexp((alpha - 1.0) * lh, axis=1) - np.log(n)) / (alpha - 1.0)


def discriminability_pold(lh: np.ndarray, alpha: float) -> np.ndarray:
    """E8 per prompt: D̂'_t = 1/(α−1)·log mean_n (ĥ^n)^α − α/(α−1)·log Ẑ, the π^old-sampling ablation.

    ``lh`` [P, N, T+1, m], x_t^n on the policy's own trajectories; Ẑ = mean over the
    trajectories' endpoints of exp(r̃/β) (t = 0). α = 1: (mean_n ĥ log ĥ)/Ẑ − log Ẑ (the KL).
    """
    n = lh.shape[1]
    log_z = logsumexp(lh[:, :, 0], axis=1) - np.log(n)
    if alpha == 1.0:  # mean_n ĥ·log ĥ / Ẑ, the exponent shifted by its largest value so that it cannot overflow
        d = lh - log_z[:, None, None, :]
        top = d.max(axis=1, keepdims=True)
        weighted = np.exp(top[:, 0]) * np.mean(np.exp(d - top) * lh, axis=1)
        return weighted - log_z[:, None, :]
    return (logsumexp(alpha * lh, axis=1) - np.log(n)) / (alpha - 1.0) - alpha / (alpha - 1.0) * log_z[:, None, :]


def jackknife_pplus(lh_drop: np.ndarray, lh_full: np.ndarray, alpha: float) -> np.ndarray:
    """Delete-one-k jackknife of E6 against the finite-K bias at α ≠ 2: K·D̂ − (K−1)·mean_j D̂_(−j)."""
    K = lh_drop.shape[3]
    full = discriminability_pplus(lh_full, alpha)
    drops = np.stack([discriminability_pplus(lh_drop[:, :, :, j], alpha) for j in range(K)])
    return K * full - (K - 1) * drops.mean(axis=0)


def shift_and_average(d_prompt: np.ndarray) -> np.ndarray:
    """E7: D̂_{i,t}(c) = D̂'_{i,t}(c) − D̂'_{i,T}(c), then the mean over prompts → [T+1, m]."""
    return (d_prompt - d_prompt[:, -1:, :]).mean(axis=0)


def isotonic_nonincreasing(y: np.ndarray) -> np.ndarray:
    """Least-squares projection of y onto non-increasing sequences (pool-adjacent-violators)."""
    values: list[float] = []
    weights: list[int] = []
    for v in y.tolist():
        values.append(v)
        weights.append(1)
        while len(values) > 1 and values[-2] < values[-1]:
            w = weights[-2] + weights[-1]
            values[-2] = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w
            weights[-2] = w
            values.pop()
            weights.pop()
    return np.repeat(values, weights)


def monotone_gains(D: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """E5 made non-negative after averaging over prompts. ``D`` [T+1] with D_T = 0.

    Returns ``(gain_raw, gain)`` of length T (index t−1 = step t). ``isotonic``: project D
    onto non-increasing sequences that stay ≥ D_T = 0 (PAVA, then the bound), then difference:
    the gains telescope to the projected D_0. ``clip`` (the paper): max(ΔD̂, 0).
    """
    raw = D[:-1] - D[1:]
    if method == "clip":
        return raw, np.maximum(raw, 0.0)
    if method != "isotonic":
        raise ValueError(f"unknown monotone method {method!r}")
    # With the anchor D_T = 0 fixed, projecting onto {non-increasing, ≥ 0} is the isotonic fit clipped at 0.
    projected = np.append(np.maximum(isotonic_nonincreasing(D[:-1]), 0.0), 0.0)
    return raw, np.maximum(projected[:-1] - projected[1:], 0.0)


@dataclass(frozen=True)
class GainEstimate:
    """D and gains per reward (arrays [m, T+1] and [m, T]) with bootstrap intervals and the bootstrap's
    per-draw gains [B, m, T] (None if P < 2), and E14's per-step advantage correlations (None if K < 2)."""

    D: np.ndarray
    gain_raw: np.ndarray
    gain: np.ndarray
    D_lo: np.ndarray | None
    D_hi: np.ndarray | None
    gain_lo: np.ndarray | None
    gain_hi: np.ndarray | None
    reward_scale: np.ndarray
    surrogate: dict[str, dict[str, float]]
    gain_draws: np.ndarray | None = None
    advantage_corr: dict | None = None


def advantage_correlation(scores: np.ndarray, scale: np.ndarray, rewards: tuple[str, ...]) -> dict | None:
    """E14 (ours): per step t and pair of rewards (i, j), the correlation of their advantages within a group.

    The K rollouts from one state x_t^n form a group, as the G samples of one prompt do in training: each
    rollout's advantage for reward i is its standardised reward minus the group's mean,
    a_i = r̃_i − mean_k r̃_i. ρ_{ij,t} = Σ a_i·a_j / sqrt(Σ a_i² · Σ a_j²), pooled over prompts, states and
    rollouts. It measures what the rest of the trajectory from σ_t decides: ρ < 0 means that what raises
    reward i from x_t lowers reward j — the two conflict at step t. None when K < 2 (no group); a ρ is
    None (null) where either reward did not vary within any group. ``n`` = P·N groups, with K − 1 degrees
    of freedom each (``conflict_steps``' interval).
    """
    K = scores.shape[3]
    m = len(rewards)
    if K < 2 or m < 2:
        return None
    z = scores[:, :, 1:] / scale[:, None, None, None, :]
    a = z - z.mean(axis=3, keepdims=True)
    pairs, rho = [], []
    for i in range(m):
        for j in range(i + 1, m):
            cross = (a[..., i] * a[..., j]).sum(axis=(0, 1, 3))
            norm = np.sqrt((a[..., i] ** 2).sum(axis=(0, 1, 3)) * (a[..., j] ** 2).sum(axis=(0, 1, 3)))
            with np.errstate(invalid="ignore", divide="ignore"):
                r = np.clip(cross / norm, -1.0, 1.0)
            pairs.append([rewards[i], rewards[j]])
            rho.append([None if not (nrm > 0) else float(v) for v, nrm in zip(r, norm)])
    return {"pairs": pairs, "rho": rho, "n": int(scores.shape[0] * scores.shape[1]), "K": int(K)}


def per_prompt_discriminability(scores: np.ndarray, alpha: float, beta: float, sampling: str,
                                standardise: bool, jackknife: bool = False,
                                scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """D̂'_{i,t}(c) for every prompt ([P, T+1, m]) and the reward scales used ([P, m]).

    ``scale`` [P, m] overrides the π^old std of ``reward_scale`` (e.g. the scale ``self``
    positives were tilted with); it is used only when standardising.
    """
    scale = reward_scale(scores, standardise) if scale is None or not standardise else np.asarray(scale, np.float64)
    check_log_weights(scores, scale, beta, alpha)
    lh = log_h(scores, scale, beta)
    if sampling == "pplus":
        if jackknife and alpha != 2.0:
            return jackknife_pplus(log_h(scores, scale, beta, jackknife=True), lh, alpha), scale
        return discriminability_pplus(lh, alpha), scale
    if sampling == "pold":
        return discriminability_pold(lh, alpha), scale
    raise ValueError(f"unknown sampling {sampling!r}")


def check_log_weights(scores: np.ndarray, scale: np.ndarray, beta: float, alpha: float) -> None:
    """BadInput naming the cause unless max(α, 1)·|r̃|/β ≤ MAX_LOG_WEIGHT for every score: rewards too
    large for β (or α too large) would otherwise make the log-weights overflow and the table NaN.
    Taken in Python floats, so checking an absurd value warns of nothing."""
    finite = np.abs(scores[np.isfinite(scores)])
    top = float(finite.max()) / float(scale.min()) if finite.size else 0.0
    weight = max(alpha, 1.0) * top / beta
    if not weight <= MAX_LOG_WEIGHT:
        raise BadInput(f"reward values reach |r̃| = {top:.4g} (the score over its scale), too large for "
                       f"β = {beta:g} and α = {alpha:g}: the log-weights α·r̃/β reach {weight:.4g} and overflow "
                       f"float64 (at most {MAX_LOG_WEIGHT:g}); scale the rewards down or raise --beta")


def surrogate_check(scores: np.ndarray, scale: np.ndarray, beta: float, rewards: tuple[str, ...]) -> dict:
    """docs/method.md §4's t = 0 diagnostic per reward: mean_{P'} w against mean_Q w² / mean_Q w.

    w = exp(r̃/β); P' = the positives (t = 0), Q = the policy's own samples, which are the
    rollouts from pure noise (t = T). For exact π⁺ positives both sides agree.
    """
    z = scores / (scale[:, None, None, None, :] * beta)
    out = {}
    for i, name in enumerate(rewards):
        q = z[:, :, -1, :, i].ravel()
        pos = z[:, :, 0, 0, i].ravel()
        shift = max(q.max(), pos.max())
        # both sides carry the same factor exp(−shift), so they stay comparable; the policy side
        # mean(w²)/mean(w) is taken in the log domain, so it underflows to 0, never to 0/0
        policy = np.exp(logsumexp(2 * (q - shift)) - logsumexp(q - shift))
        out[name] = {"positives": float(np.exp(pos - shift).mean()), "policy": float(policy)}
    return out


def estimate_gains(scores: np.ndarray, rewards: tuple[str, ...], alpha: float = 2.0, beta: float = 1.0,
                   sampling: str = "pplus", monotone: str = "isotonic", standardise: bool = True,
                   bootstrap: int = 200, seed: int = 0, jackknife: bool = False,
                   scale: np.ndarray | None = None, bootstrap_over: str = "auto",
                   paired: bool = True) -> GainEstimate:
    """E3-E8 end to end from a dense score array [P, N, T+1, K, m] (``scale``: see
    ``per_prompt_discriminability``).

    The bootstrap (``bootstrap`` draws) resamples ``bootstrap_over``: ``prompts`` (the prompts, each with its
    N samples: the error of the gains over the prompt distribution), ``samples`` (each prompt's N positives
    with their rollouts, the prompts fixed: the error of these prompts' gains) or ``both`` (prompts, then
    samples within each); ``auto`` picks by the number of prompts (``bootstrap_unit``). Every draw standardises by the point estimate's scales. ``paired``: every reward was
    scored on the same rollouts, so E14's advantage correlations are measured (else None).
    """
    if bootstrap_over not in BOOTSTRAP_OVER:
        raise ValueError(f"unknown bootstrap unit {bootstrap_over!r}")
    bootstrap_over = bootstrap_unit(bootstrap_over, scores.shape[0])
    d_prompt, scale = per_prompt_discriminability(scores, alpha, beta, sampling, standardise, jackknife, scale)
    D = shift_and_average(d_prompt)
    m = D.shape[1]
    raw_gain, gain = zip(*(monotone_gains(D[:, i], monotone) for i in range(m)))
    D_lo = D_hi = gain_lo = gain_hi = draws = None
    P, N = scores.shape[:2]
    if bootstrap > 0 and (P >= 2 if bootstrap_over == "prompts" else N >= 2):
        rng = np.random.default_rng(seed)
        boot_D = np.empty((bootstrap, D.shape[0], m))
        boot_gain = np.empty((bootstrap, D.shape[0] - 1, m))
        for b in range(bootstrap):
            pick = rng.integers(0, P, P) if bootstrap_over != "samples" else np.arange(P)
            if bootstrap_over == "prompts":
                Db = shift_and_average(d_prompt[pick])
            else:
                within = rng.integers(0, N, (P, N))
                resampled = scores[pick[:, None], within]
                Db = shift_and_average(per_prompt_discriminability(resampled, alpha, beta, sampling, standardise,
                                                                   jackknife, scale[pick])[0])
            boot_D[b] = Db
            for i in range(m):
                boot_gain[b, :, i] = monotone_gains(Db[:, i], monotone)[1]
        D_lo, D_hi = (np.percentile(boot_D, q, axis=0).T for q in (2.5, 97.5))
        gain_lo, gain_hi = (np.percentile(boot_gain, q, axis=0).T for q in (2.5, 97.5))
        draws = np.transpose(boot_gain, (0, 2, 1)).copy()
    surrogate = surrogate_check(scores, scale, beta, rewards) if sampling == "pplus" else {}
    return GainEstimate(D=D.T.copy(), gain_raw=np.array(raw_gain), gain=np.array(gain), D_lo=D_lo, D_hi=D_hi,
                        gain_lo=gain_lo, gain_hi=gain_hi, reward_scale=scale, surrogate=surrogate,
                        gain_draws=draws if bootstrap >= 2 else None,
                        advantage_corr=advantage_correlation(scores, scale, rewards) if paired else None)

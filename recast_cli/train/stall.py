"""Stalled rewards: one reward makes no progress while another rises (docs/train.md "Stalled rewards").

The complaint users of multi-reward GRPO trainers raise most is that one reward stalls while another
climbs. This module says when that happens, from the per-step mean of each reward alone, in two forms
that give the same flags bit for bit:

* :func:`stall_flags` (and :func:`stall_onsets`): the array form, vectorised over any leading axes
  (a study's seeds), for whole curves after the fact;
* :class:`StallWatch`: the online form ``recast train`` feeds one step at a time (and replays from
  ``metrics.parquet`` on ``--resume``).

The definition, with ``x[t, i]`` the mean of reward i at step t (0-based here; step t + 1 in the
metrics), ``w`` the window, ``θ`` the threshold and ``scale_i`` the reward's own scale:

* **smoothed**: ``s[t] = s[t−1] + α·(x[t] − s[t−1])``, ``s[0] = x[0]``, an exponential moving average
  of span ``smoothing`` steps (``α = 2/(smoothing + 1)``; 1: no smoothing); a NaN step is skipped;
* **progress** over the window: ``p[t] = s[t] − s[t−w]`` for ``t ≥ w`` (undefined before);
* **headroom**: reward i still has room at t when its within-group spread ``d[t, i]`` (the std of its
  scores inside a group, smoothed the same way) is above ``HEADROOM·scale_i``: a group's images still
  differ in it, so GRPO still has something to learn from. A reward that has saturated (every image
  scores the top) has none and is finished, not stalled;
* reward i **rises** at t when ``p[t, i] > θ·scale_i``; it meets the **stall condition** at t when
  ``p[t, i] ≤ θ·scale_i`` while it has headroom and another reward rises at t. Nothing holds where p
  is undefined, and a single reward never meets it (there is no other to rise).
* Reward i is **stalled** from the first step it meets the condition (the stall's **onset**, where
  ``recast train`` warns) until it rises again, whatever the other rewards do meanwhile: a reward
  left behind while the others rose stays stalled after they have saturated. A reward that recovers
  (rises) and meets the condition again has another onset.

Rewards have different scales (a CLIP score moves by hundredths, an OCR accuracy by tenths), so θ is
in units of each reward's own spread: ``recast train`` takes as scale_i the within-group standard
deviation of reward i pooled over the first ``w`` steps (:func:`group_spread`, :func:`initial_scale`),
the spread GRPO divides its advantages by, measured before any flag can be raised. A reward with no
spread at the start (scale 0: every image of a group scores the same) has no headroom and is never
flagged: GRPO gets no signal from it at all, which is another problem than a stall.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The defaults of ``[train] stall_window``, ``stall_threshold`` and ``stall_smoothing`` (docs/train.md).
DEFAULT_WINDOW = 10
DEFAULT_THRESHOLD = 0.2
DEFAULT_SMOOTHING = 5
#: A reward has headroom while its smoothed within-group spread is above this share of its scale.
HEADROOM = 0.5


@dataclass(frozen=True)
class StallRule:
    """The detector's numbers: ``window`` (steps), ``threshold`` (in units of each reward's scale),
    ``smoothing`` (the span in steps of the moving average) and ``headroom`` (a share of the scale)."""

    window: int = DEFAULT_WINDOW
    threshold: float = DEFAULT_THRESHOLD
    smoothing: int = DEFAULT_SMOOTHING
    headroom: float = HEADROOM

    @property
    def alpha(self) -> float:
        """The weight of the newest step in the moving average."""
        return 2.0 / (self.smoothing + 1.0)


def _ema_step(previous: np.ndarray, x: np.ndarray, alpha: float) -> np.ndarray:
    """One step of the moving average: the first finite value starts it, a NaN value leaves it as it was."""
    moved = previous + alpha * (x - previous)
    return np.where(np.isnan(previous), x, np.where(np.isnan(x), previous, moved))


def smoothed(means: np.ndarray, smoothing: int = DEFAULT_SMOOTHING) -> np.ndarray:
    """The moving average of ``means`` [..., steps, m] along its steps axis (the module's definition)."""
    x = np.asarray(means, dtype=np.float64)
    alpha = StallRule(smoothing=smoothing).alpha
    out = np.empty_like(x)
    level = np.full(x.shape[:-2] + x.shape[-1:], np.nan)
    for t in range(x.shape[-2]):
        level = _ema_step(level, x[..., t, :], alpha)
        out[..., t, :] = level
    return out


def progress(means: np.ndarray, window: int = DEFAULT_WINDOW, smoothing: int = DEFAULT_SMOOTHING) -> np.ndarray:
    """``p[t] = s[t] − s[t − window]`` of the smoothed means [..., steps, m]; NaN for ``t < window``."""
    s = smoothed(means, smoothing)
    out = np.full_like(s, np.nan)
    out[..., window:, :] = s[..., window:, :] - s[..., :-window, :]
    return out


def _rising_meets(p: np.ndarray, bar: np.ndarray, room: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rises, meets the stall condition) from the progress ``p`` [..., m], each reward's bar θ·scale and
    its headroom."""
    rising = p > bar
    others = rising.sum(axis=-1, keepdims=True) - rising > 0
    return rising, (p <= bar) & room & others


def _advance(stalled: np.ndarray, rising: np.ndarray, meets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(onsets, stalled after this step): a reward not stalled that meets the condition starts a stall; a
    stall lasts until the reward rises."""
    return meets & ~stalled, ~rising & (stalled | meets)


def _array_form(means: np.ndarray, scale: np.ndarray, rule: StallRule,
                spreads: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stalled, onsets, the stall condition) [..., steps, m] of whole curves."""
    p = progress(means, rule.window, rule.smoothing)
    scale = np.asarray(scale, dtype=np.float64)[..., None, :]
    room = np.ones(p.shape, dtype=bool) if spreads is None else \
        smoothed(spreads, rule.smoothing) > rule.headroom * scale
    rising, meets = _rising_meets(p, rule.threshold * scale, room)
    stalled, onsets = np.zeros_like(meets), np.zeros_like(meets)
    state = np.zeros(meets.shape[:-2] + meets.shape[-1:], dtype=bool)
    for t in range(meets.shape[-2]):
        onsets[..., t, :], state = _advance(state, rising[..., t, :], meets[..., t, :])
        stalled[..., t, :] = state
    return stalled, onsets, meets


def stall_flags(means: np.ndarray, scale: np.ndarray, window: int = DEFAULT_WINDOW,
                threshold: float = DEFAULT_THRESHOLD, smoothing: int = DEFAULT_SMOOTHING,
                spreads: np.ndarray | None = None, headroom: float = HEADROOM, *, hold: bool = True) -> np.ndarray:
    """Whether reward i is stalled at step t: bool [..., steps, m] (the module's definition; ``hold`` False:
    the stall condition alone, step by step, without holding a stall until the reward rises again).

    ``means`` [..., steps, m]: each reward's mean per step (a leading axis: seeds, ...); ``scale``
    [..., m] or anything broadcastable to it: each reward's scale (its within-group std at the start);
    ``spreads`` [..., steps, m]: each reward's within-group std per step, for the headroom test (None:
    every reward has headroom; for a 0/1 reward in a one-prompt world ``sqrt(means·(1 − means))`` is
    its expected value).
    """
    stalled, _, meets = _array_form(means, scale, StallRule(window, threshold, smoothing, headroom), spreads)
    return stalled if hold else meets


def stall_onsets(means: np.ndarray, scale: np.ndarray, window: int = DEFAULT_WINDOW,
                 threshold: float = DEFAULT_THRESHOLD, smoothing: int = DEFAULT_SMOOTHING,
                 spreads: np.ndarray | None = None, headroom: float = HEADROOM) -> np.ndarray:
    """The steps where a stall starts (where ``recast train`` warns): bool [..., steps, m]."""
    return _array_form(means, scale, StallRule(window, threshold, smoothing, headroom), spreads)[1]


def group_spread(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """The within-group standard deviation of each reward, pooled over the groups: the root of the mean of
    the groups' (population) variances. ``rewards`` [..., B, m], each group's G images contiguous → [..., m]."""
    r = np.asarray(rewards, dtype=np.float64)
    groups = r.reshape(r.shape[:-2] + (r.shape[-2] // group_size, group_size, r.shape[-1]))
    return np.sqrt(groups.var(axis=-2).mean(axis=-2))


def initial_scale(spreads: np.ndarray, steps: int) -> np.ndarray:
    """Each reward's scale: its within-group spreads [..., steps, m] pooled (root mean square) over the first
    ``steps`` steps that have one (NaN: a step that recorded none); NaN where none of them has one."""
    head = np.asarray(spreads, dtype=np.float64)[..., :steps, :]
    known = ~np.isnan(head)
    count = known.sum(axis=-2)
    total = np.where(known, head * head, 0.0).sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(np.where(count > 0, total / np.maximum(count, 1), np.nan))


@dataclass(frozen=True)
class StallStep:
    """What the watch says after one step: per reward, stalled, onset (warn now), its progress over the
    window and its bar θ·scale (NaN until defined)."""

    flags: np.ndarray
    onsets: np.ndarray
    progress: np.ndarray
    bar: np.ndarray


class StallWatch:
    """The online form of :func:`stall_flags` / :func:`stall_onsets` for one run: fed each step's means and
    within-group spreads in order, it gives the same flags and onsets as the array form given those
    spreads and ``initial_scale(spreads, rule.window)`` as the scale."""

    def __init__(self, rewards: Sequence[str], rule: StallRule):
        self.rewards = tuple(rewards)
        self.rule = rule
        m = len(self.rewards)
        self.level = np.full(m, np.nan)
        self.spread = np.full(m, np.nan)
        self.history: deque[np.ndarray] = deque(maxlen=rule.window + 1)
        self.first: list[np.ndarray] = []
        self.scale = np.full(m, np.nan)
        self.stalled = np.zeros(m, dtype=bool)

    def update(self, means: Sequence[float], spreads: Sequence[float]) -> StallStep:
        """Feed the next step's mean and within-group spread of every reward (NaN: not known)."""
        m, rule = len(self.rewards), self.rule
        d = np.asarray(spreads, dtype=np.float64).reshape(m)
        if len(self.first) < rule.window:
            self.first.append(d)
            self.scale = initial_scale(np.stack(self.first), rule.window)
        self.level = _ema_step(self.level, np.asarray(means, dtype=np.float64).reshape(m), rule.alpha)
        self.spread = _ema_step(self.spread, d, rule.alpha)
        self.history.append(self.level)
        p = self.history[-1] - self.history[0] if len(self.history) > rule.window else np.full(m, np.nan)
        bar = rule.threshold * self.scale
        rising, meets = _rising_meets(p, bar, self.spread > rule.headroom * self.scale)
        onsets, self.stalled = _advance(self.stalled, rising, meets)
        return StallStep(self.stalled, onsets, p, bar)


def onset_message(watch: StallWatch, step: int, result: StallStep, reward: int) -> str:
    """The one warning line of a stall's onset at training step ``step``: the reward, its progress against
    its bar, and the rewards that rose meanwhile."""
    rule = watch.rule
    rose = [f"{name} rose {result.progress[j]:+.3g}" for j, name in enumerate(watch.rewards)
            if j != reward and result.progress[j] > result.bar[j]]
    gain = result.progress[reward]
    scale = watch.scale[reward]
    return (f"reward {watch.rewards[reward]} stalled at step {step}: its mean moved {gain:+.3g} over the last "
            f"{rule.window} steps (smoothed), not more than {rule.threshold:g} × its within-group std "
            f"{scale:.3g} = {result.bar[reward]:.3g}, while {', '.join(rose)}")


@dataclass(frozen=True)
class StallSpan:
    """One reward's recorded flags over a run: the first step flagged (None: never), how many steps were,
    and the step the stall it ends in began (None: not stalled at its last step)."""

    reward: str
    first: int | None
    steps: int
    since: int | None


def recorded_stalls(columns: Mapping[str, Sequence[Any]]) -> dict[str, StallSpan] | None:
    """Each reward's :class:`StallSpan` from a run's metrics as lists by column (pyarrow's ``to_pydict``;
    ``step``, ``reward``, ``stall``; rows in any order, rewards in order of appearance); None when no
    flag is recorded (a run of an older recast, or with ``stall_detector = false``)."""
    flags = columns.get("stall")
    if flags is None or all(f is None for f in flags):
        return None
    per: dict[str, dict[int, bool]] = {}
    for step, reward, flag in zip(columns["step"], columns["reward"], flags):
        per.setdefault(str(reward), {})[int(step)] = bool(flag)
    spans = {}
    for reward, marks in per.items():
        order = sorted(marks)
        flagged = [s for s in order if marks[s]]
        since = None
        for s in reversed(order):
            if not marks[s]:
                break
            since = s
        spans[reward] = StallSpan(reward, flagged[0] if flagged else None, len(flagged), since)
    return spans

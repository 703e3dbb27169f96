"""Reward conflicts seen in training (docs/trust.md): each pair of rewards' group-advantage correlation per
training step (``conflict/A,B`` in the metrics), and the one warning per pair when two rewards anti-correlate
where W gives one of them most of a column — ReCAST then settles their conflict by timing, not by λ."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from recast_cli.solve.conflict import CONFLICT_RHO, conflict_message

#: the training steps over which a pair's advantage correlation is averaged before it can warn
WINDOW = 5


def advantage_correlation(adv: np.ndarray) -> np.ndarray:
    """The correlation matrix [m, m] of the rewards' group advantages A_i over a step's samples [n, m]
    (NaN where a reward's advantages are all zero)."""
    a = np.asarray(adv, dtype=np.float64)
    a = a - a.mean(axis=0, keepdims=True)
    norm = np.sqrt((a ** 2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (a.T @ a) / np.outer(norm, norm)
    out[~np.isfinite(out)] = np.nan
    return np.clip(out, -1.0, 1.0)


def pair_name(a: str, b: str) -> str:
    """The logger series of a pair: ``conflict/A,B``."""
    return f"conflict/{a},{b}"


class ConflictWatch:
    """Watches each pair's advantage correlation over the training steps and warns once per pair.

    W's columns fixed (``W`` [m, T] in the run's reward order): a pair can warn only at the trained steps
    where W gives one of the two more than half of the column (``owned``). It warns at the start when the
    estimate found the pair in conflict at such steps (W's ``info.settled_by_timing``), and during training
    when its correlation, averaged over the last ``WINDOW`` steps, falls below −``CONFLICT_RHO``.
    """

    def __init__(self, rewards: Sequence[str], W: np.ndarray, trained_steps: Sequence[int],
                 info: dict[str, Any] | None = None):
        self.rewards = tuple(rewards)
        self.warned: set[tuple[str, str]] = set()
        self.recent: dict[tuple[str, str], deque] = {}
        self.owned: dict[tuple[str, str], list[int]] = {}
        m = len(self.rewards)
        for i in range(m):
            for j in range(i + 1, m):
                steps = []
                for t in trained_steps:
                    column = W[:, t - 1]
                    total = column.sum()
                    if total > 0 and max(column[i], column[j]) > 0.5 * total:
                        steps.append(int(t))
                pair = (self.rewards[i], self.rewards[j])
                self.owned[pair] = steps
                self.recent[pair] = deque(maxlen=WINDOW)
        self.settled = [(tuple(item["pair"]), list(item["steps"])) for item in (info or {}).get("settled_by_timing", [])
                        if all(r in self.rewards for r in item["pair"])]

    def start(self) -> list[str]:
        """The warnings of the conflicts the estimate found where W settles them by timing (once per pair)."""
        lines = []
        for pair, steps in self.settled:
            key = tuple(sorted(pair, key=self.rewards.index))
            if key not in self.warned:
                self.warned.add(key)
                lines.append(conflict_message(key, steps, "E14, the estimate"))
        return lines

    def update(self, corr: np.ndarray) -> list[str]:
        """One training step's correlation matrix [m, m]; the warnings of the pairs that cross the line now."""
        lines = []
        for (a, b), window in self.recent.items():
            i, j = self.rewards.index(a), self.rewards.index(b)
            value = corr[i, j]
            if np.isfinite(value):
                window.append(float(value))
            if (a, b) in self.warned or len(window) < WINDOW or not self.owned[(a, b)]:
                continue
            mean = float(np.mean(window))
            if mean < -CONFLICT_RHO:
                self.warned.add((a, b))
                lines.append(conflict_message((a, b), self.owned[(a, b)],
                                              f"advantage correlation {mean:+.2f} over the last {WINDOW} training steps"))
        return lines

    def scalars(self, corr: np.ndarray) -> dict[str, float]:
        """The logger series ``conflict/A,B`` of one step."""
        out = {}
        for a, b in self.recent:
            value = corr[self.rewards.index(a), self.rewards.index(b)]
            out[pair_name(a, b)] = float(value) if np.isfinite(value) else float("nan")
        return out

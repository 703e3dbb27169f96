"""Paired ReCAST − static (and no-Sink − static) differences of the toy study's evaluations.

Reads the ``recast.eval/1`` tables that ``make all SETTING=toy`` writes
(``EVALS/<budget>/<mode>-s<seed>.parquet``) through ``recast report``'s loader and prints,
per budget and seed, the difference in the aggregate r = Σ λ_i r_i (integer λ, the report's
Table 1/2 convention) between two modes trained from the same warmup with the same seed,
then the mean, sd and a 95 % t interval over all (budget, seed) pairs. Every eval scores the same prompts with the same ODE
seeds, so the differences are paired image by image.

    .venv/bin/python docs/results/toy/paired.py artifacts/toy/evals
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from scipy import stats

from recast_cli.report.inputs import AGGREGATE, budget_label, load_inputs


def main(root: Path) -> None:
    inputs = load_inputs(sorted(root.glob("*/*-s*.parquet")))
    means = {(e.budget, e.mode, e.seed): e.means() for e in inputs.evals}
    rewards = inputs.evals[0].table.meta["rewards"]
    budgets = sorted({b for b, _, _ in means})
    for other in ("recast", "nosink"):
        diffs = []
        print(f"\n{other} − static, aggregate Σλ·r (eval: prompts × ODE seeds of the setting)")
        print(f"{'budget':>8} {'seed':>4} {'static':>8} {other:>8} {'diff':>8}   per-reward diff")
        for b in budgets:
            for s in sorted(s for bb, m, s in means if bb == b and m == "static"):
                if (b, other, s) not in means:
                    continue
                m0, m1 = means[(b, "static", s)], means[(b, other, s)]
                d = m1[AGGREGATE] - m0[AGGREGATE]
                diffs.append(d)
                per = " ".join(f"{r}={m1[r] - m0[r]:+.4f}" for r in rewards)
                print(f"{budget_label(b):>8} {s:>4} {m0[AGGREGATE]:8.4f} {m1[AGGREGATE]:8.4f} {d:+8.4f}   {per}")
        n = len(diffs)
        if n < 2:
            continue
        mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
        lo, hi = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
        wins = sum(d > 0 for d in diffs)
        sign_p = stats.binomtest(wins, n).pvalue
        print(f"pairs {n}: mean {mean:+.4f}, sd {sd:.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}], "
              f"{other} ahead in {wins}/{n} (two-sided sign test p = {sign_p:.3f})")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/toy/evals"))

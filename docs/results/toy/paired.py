"""Paired ReCAST − static (and no-Sink − static) differences of the toy study's evaluations.

Reads the ``recast.eval/1`` tables that ``make all SETTING=toy`` writes
(``EVALS/<budget>/<mode>-s<seed>.parquet``) and prints, per budget and seed, the difference
in the aggregate r = Σ λ_i r_i (integer λ, the report's Table 1/2 convention) between two
modes trained from the same warmup with the same seed, then the mean, sd and a 95 % t
interval over all (budget, seed) pairs. Every eval scores the same prompts with the same ODE
seeds, so the differences are paired image by image.

    .venv/bin/python docs/results/toy/paired.py artifacts/toy/evals
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq
from scipy import stats


def aggregate(path: Path) -> tuple[tuple[int, ...], float, dict[str, float]]:
    """(λ, mean aggregate reward, per-reward means) of one eval table."""
    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    lam = tuple(int(x) for x in json.loads(meta["lambda"]))
    rewards = json.loads(meta["rewards"])
    frame = table.to_pandas()
    frame = frame[frame["kind"] == "reward"]
    means = frame.groupby("scorer")["score"].mean().to_dict()
    return lam, sum(l * means[r] for l, r in zip(lam, rewards)), {r: means[r] for r in rewards}


def main(root: Path) -> None:
    rows: dict[tuple[str, str, int], tuple[float, dict[str, float]]] = {}
    for path in sorted(root.glob("*/*-s*.parquet")):
        mode, seed = path.stem.rsplit("-s", 1)
        _, agg, per = aggregate(path)
        rows[(path.parent.name, mode, int(seed))] = (agg, per)
    budgets = sorted({b for b, _, _ in rows})
    for other in ("recast", "nosink"):
        diffs = []
        print(f"\n{other} − static, aggregate Σλ·r (eval: prompts × ODE seeds of the setting)")
        print(f"{'budget':>8} {'seed':>4} {'static':>8} {other:>8} {'diff':>8}   per-reward diff")
        for b in budgets:
            for s in sorted({s for bb, m, s in rows if bb == b and m == "static"}):
                if (b, other, s) not in rows:
                    continue
                (a0, p0), (a1, p1) = rows[(b, "static", s)], rows[(b, other, s)]
                diffs.append(a1 - a0)
                per = " ".join(f"{r}={p1[r] - p0[r]:+.4f}" for r in p0)
                print(f"{b:>8} {s:>4} {a0:8.4f} {a1:8.4f} {a1 - a0:+8.4f}   {per}")
        n = len(diffs)
        if n < 2:
            continue
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        wins = sum(d > 0 for d in diffs)
        sign_p = stats.binomtest(wins, n).pvalue
        print(f"pairs {n}: mean {mean:+.4f}, sd {sd:.4f}, 95% CI [{mean - half:+.4f}, {mean + half:+.4f}], "
              f"{other} ahead in {wins}/{n} (two-sided sign test p = {sign_p:.3f})")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/toy/evals"))

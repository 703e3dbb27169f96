"""Solve time of recast's log-domain Sinkhorn (E12) against POT's, on the same kernels, same process.

Two sizes: 4 x 25 (four rewards on the estimator's grid) and 64 x 1000 (a stress size).
Gains are Gaussian windows at random steps and widths (seeded), mean-normalised (E10),
kernel exp(ΔD̄/τ) with τ = 1 (E11), rows λ̂ random, columns 1/T. Both solvers run to a max
marginal error of 1e-10; the table prints median wall times, the ratio POT / recast, the
final marginal errors and the distance between the two solutions.

Targets (issue: foundation): 4 x 25 < 1 ms, 64 x 1000 < 50 ms.
Run: make bench  (or .venv/bin/python benchmarks/bench_sinkhorn.py)
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import ot
from rich.console import Console
from rich.table import Table

from recast_cli.solve.sinkhorn import indiscriminable_rows, log_affinity, marginal_error, mean_normalised_gain, sinkhorn_log

TOL = 1e-10
TARGETS_MS = {(4, 25): 1.0, (64, 1000): 50.0}


def problem(m: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    peaks = rng.uniform(1, steps, m)
    widths = rng.uniform(0.02, 0.3, m) * steps
    gain = np.exp(-0.5 * ((t[None, :] - peaks[:, None]) / widths[:, None]) ** 2)
    log_k = log_affinity(mean_normalised_gain(gain, indiscriminable_rows(gain)))
    row = rng.uniform(1, 2, m)
    return log_k, row / row.sum(), np.full(steps, 1.0 / steps)


def median_time(fn, budget_s: float = 1.5, min_runs: int = 5) -> tuple[float, object]:
    times, result = [], None
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 2000:
            break
    return statistics.median(times), result


def main() -> None:
    table = Table(title=f"Sinkhorn to a max marginal error of {TOL:g}: recast vs POT (same process)")
    for col in ("size", "recast ms", "iterations", "POT ms", "POT / recast", "target", "met",
                "err recast", "err POT", "max |W - W_POT|"):
        table.add_column(col, justify="right")
    for (m, steps), target in TARGETS_MS.items():
        log_k, row, col = problem(m, steps)
        ours_s, ours = median_time(lambda: sinkhorn_log(log_k, row, col, tol=TOL))
        pot_s, pot = median_time(lambda: ot.sinkhorn(row, col, -log_k, 1.0, method="sinkhorn_log",
                                                      stopThr=TOL, numItermax=1_000_000), budget_s=3.0, min_runs=3)
        ours_ms, pot_ms = ours_s * 1e3, pot_s * 1e3
        table.add_row(f"{m} x {steps}", f"{ours_ms:.3f}", str(ours.iterations), f"{pot_ms:.2f}",
                      f"{pot_ms / ours_ms:.1f}x", f"< {target:g} ms", "yes" if ours_ms < target else "NO",
                      f"{ours.error:.1e}", f"{marginal_error(pot, row, col):.1e}", f"{np.abs(ours.W - pot).max():.1e}")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()

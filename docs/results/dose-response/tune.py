"""The tuning of the dose-response study, as pre-registered (preregistration.md, "Tuning" and "Seeds").

    python docs/results/dose-response/tune.py run  [--jobs 2]   # every world × learning rate, seeds 1000-1031
    python docs/results/dose-response/tune.py pick              # tune.md, the chosen rates, the seed count

``run`` calls ``recast study`` once per (world, learning rate) on the tuning seeds, with ``--jobs``
shards in parallel (each shard one process on one core); done cells are kept, so it resumes.
``pick`` reads the cells and writes ``tune.md`` beside this file: per (world, arm, G) the mean
primary endpoint at every grid value, the chosen rate (the best; ties to the smaller), every arm
at static's chosen rate, and the power calculation. It also prints the ``learning_rates`` table
for each setting.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORLDS = ("m2", "m3", "m4", "control")
GRID = (1e-2, 2e-2, 4e-2, 8e-2)
SEEDS = "1000:1032"
OUT = ROOT / "artifacts" / "dose-tune"
RECAST = Path(sys.executable).parent / "recast"


def run(jobs: int) -> None:
    env = {**os.environ, "RECAST_THREADS": "1"}
    import shutil

    for world in WORLDS:
        for lr in GRID:
            out = OUT / world / f"lr{lr:g}"
            first = OUT / world / f"lr{GRID[0]:g}"
            if out != first and (first / "W").is_dir() and not (out / "W").exists():
                # the gains and W do not depend on the learning rate: the first rate's, reused
                for part in ("gains", "W"):
                    shutil.copytree(first / part, out / part)
            procs = [subprocess.Popen([str(RECAST), "study", str(ROOT / "pipelines" / "dose" / f"{world}.toml"),
                                       "--out", str(out), "--seeds", SEEDS, "--set", f"learning_rate={lr}",
                                       "--no-report", "--quiet", "--shard", f"{i}/{jobs}"], env=env)
                     for i in range(jobs)]
            if any(p.wait() for p in procs):
                sys.exit(f"recast study failed for {world} at learning rate {lr:g}")
            print(f"{world} lr {lr:g}: done", flush=True)


def mean_reward_endpoint(cell, seed: int) -> float:
    """The pre-registered primary endpoint: the mean over SDE checkpoints of (1/m)·Σ_i r_i."""
    from recast_cli.report.statistics import primary

    return primary(cell.curve(seed)) / float(np.sum(cell.meta["lambda"]))


def load(world: str) -> dict:
    """(arm, G, lr) → {seed: endpoint}."""
    from recast_cli.artifacts import read_cell

    table = {}
    for lr in GRID:
        for path in sorted((OUT / world / f"lr{lr:g}" / "cells").glob("*.parquet")):
            cell = read_cell(path)
            table[(cell.label, cell.meta["group_size"], lr)] = {s: mean_reward_endpoint(cell, s) for s in cell.seeds}
    return table


def pick() -> None:
    from scipy import stats

    lines = ["# Tuning of the dose-response study\n",
             "As pre-registered: every (world, arm, G) at every learning rate of the grid "
             f"{', '.join(f'{g:g}' for g in GRID)}, on seeds {SEEDS.replace(':', '–')} (half-open; "
             "outside the study), 30 steps each. Mean primary endpoint (mean reward over the ten SDE "
             "checkpoints) ± sd over the 32 seeds; **bold** is the chosen rate (the best; ties to the "
             "smaller). Written by `tune.py pick` from the cells in `artifacts/dose-tune/`.\n"]
    chosen: dict[tuple[str, str, int], float] = {}
    tables = {}
    for world in WORLDS:
        table = load(world)
        tables[world] = table
        arms = list(dict.fromkeys(a for a, _, _ in table))
        sizes = sorted({g for _, g, _ in table})
        lines.append(f"## {world}\n")
        lines.append("| arm | G | " + " | ".join(f"lr {lr:g}" for lr in GRID) + " | chosen |")
        lines.append("|---|---:|" + "---:|" * len(GRID) + "---:|")
        for arm in arms:
            for g in sizes:
                means = {lr: float(np.mean(list(table[(arm, g, lr)].values()))) for lr in GRID}
                best = max(GRID, key=lambda lr: (round(means[lr], 12), -lr))
                chosen[(world, arm, g)] = best
                cells = []
                for lr in GRID:
                    v = np.array(list(table[(arm, g, lr)].values()))
                    text = f"{v.mean():.4f} ± {v.std(ddof=1):.4f}"
                    cells.append(f"**{text}**" if lr == best else text)
                edge = " (grid edge)" if best in (GRID[0], GRID[-1]) else ""
                lines.append(f"| {arm} | {g} | " + " | ".join(cells) + f" | {best:g}{edge} |")
        lines.append("")
        lines.append("Every arm at static's chosen rate (the baseline's learning rate), mean − static's mean, "
                     "paired over the 32 tuning seeds:\n")
        lines.append("| arm | G | static's rate | arm − static (mean ± sd) |")
        lines.append("|---|---:|---:|---:|")
        for arm in arms:
            if arm == "static":
                continue
            for g in sizes:
                lr = chosen[(world, "static", g)]
                a, s = table[(arm, g, lr)], table[("static", g, lr)]
                d = np.array([a[k] - s[k] for k in sorted(a)])
                lines.append(f"| {arm} | {g} | {lr:g} | {d.mean():+.4f} ± {d.std(ddof=1):.4f} |")
        lines.append("")
    # the power calculation (preregistration.md, "Seeds")
    m2 = tables["m2"]
    a = m2[("recast-power", 16, chosen[("m2", "recast-power", 16)])]
    s0 = m2[("static", 16, chosen[("m2", "static", 16)])]
    d = np.array([a[k] - s0[k] for k in sorted(a)])
    n = len(d)
    s = float(d.std(ddof=1))
    s_u = s * math.sqrt((n - 1) / stats.chi2.ppf(0.2, n - 1))
    N = 256
    while True:
        need = math.ceil((stats.t.ppf(0.975, N - 1) * s_u / 0.01) ** 2)
        if need <= N:
            break
        N = min(need, 1024)
        if N == 1024:
            break
    lines.append("## Seeds: the power calculation\n")
    lines.append(f"Paired sd of recast-power − static at m = 2, G = 16 (chosen rates, {n} tuning seeds): s = {s:.4f}; "
                 f"its one-sided 80% upper limit s_u = s·√({n - 1}/χ²₀.₂,{n - 1}) = {s_u:.4f}. "
                 f"N = max(256, ⌈(t₀.₉₇₅·s_u/0.01)²⌉) = **{N}** seeds per cell"
                 + (" (the cap of 1024 binds: the half-width target is not met)" if N == 1024 and need > 1024 else "")
                 + f"; expected 95% half-width {stats.t.ppf(0.975, N - 1) * s / math.sqrt(N):.4f} at s.\n")
    (HERE / "tune.md").write_text("\n".join(lines))
    print("\n".join(lines))
    for world in WORLDS:
        rates = {f"{arm}@{g}": lr for (w, arm, g), lr in chosen.items() if w == world}
        entries = ", ".join('"%s" = %g' % (k, v) for k, v in rates.items())
        print(f"[{world}] learning_rates = {{{entries}}}")
    print(f"seeds = \"0:{N}\"")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "pick"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
        run(jobs)
    else:
        pick()

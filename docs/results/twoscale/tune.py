"""Tune the two-timescale study's learning rate and β_KL on the static arm only (issue 16).

The pre-registration rule: the study's hyperparameters are chosen on the *baseline* arm
(static W), with training seeds outside the study's 16, by the study's own primary endpoint
(the mean aggregate reward over the checkpoints under the training sampler), averaged over
the study's budgets and these seeds. No ReCAST, no-Sink or reversed run is made here.

    python docs/results/twoscale/tune.py --work artifacts/twoscale-tune --jobs 2 > docs/results/twoscale/tune-pass1.md
    python docs/results/twoscale/tune.py --work artifacts/twoscale-tune-b30 --max-steps 30 --save-every 3 \
        --lrs 3e-3,1e-2,3e-2,1e-1 --betas 0,0.01 --jobs 2 > docs/results/twoscale/tune-pass2.md

Every run and evaluation goes through the real CLI (`recast train`, `recast evaluate`) and is
skipped when its output exists, so an interrupted tuning resumes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
SETTING = ROOT / "pipelines" / "twoscale.toml"
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
BETAS = (0.0, 0.01, 0.1)
SEEDS = (100, 101, 102)  # outside the study's seeds 0 … 15
BUDGETS = ("1,1", "1,2", "2,1")  # the study's
N_EVAL = 8192


def recast() -> str:
    here = Path(sys.executable).parent / "recast"
    return str(here) if here.is_file() else (shutil.which("recast") or "recast")


def job(work: Path, budget: tuple[int, int], lr: float, beta: float, seed: int, lam: str) -> Path:
    name = f"lr{lr:g}-beta{beta:g}/lambda-{lam.replace(',', '-')}-s{seed}"
    run, curve = work / "runs" / name, work / "evals" / f"{name}.parquet"
    if not curve.is_file():
        if not (run / ".done").is_file():
            subprocess.run([recast(), "train", "--setting", str(SETTING), "--weights", "static", "--seed", str(seed),
                            "--lambda", lam, "--set", f"learning_rate={lr:g}", "--set", f"beta_kl={beta:g}",
                            "--max-steps", str(budget[0]), "--save-every", str(budget[1]),
                            "--out", str(run), "--resume", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            (run / ".done").touch()
        curve.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([recast(), "evaluate", "--run", str(run), "--checkpoints", "all", "--sampler", "sde",
                        "--n", str(N_EVAL), "--out", str(curve), "--quiet"], check=True, stdout=subprocess.DEVNULL)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "artifacts" / "twoscale-tune")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=100, help="the step budget of every run")
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint interval (10 checkpoints per run)")
    parser.add_argument("--lrs", default=",".join(f"{v:g}" for v in LEARNING_RATES))
    parser.add_argument("--betas", default=",".join(f"{v:g}" for v in BETAS))
    parser.add_argument("--smoke", action="store_true", help="one configuration, seed and budget: checks the script")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from recast_cli.artifacts import read_curve
    from recast_cli.report.statistics import primary

    lrs, betas = ([float(v) for v in arg.split(",")] for arg in (args.lrs, args.betas))
    grid = list(itertools.product(lrs, betas, SEEDS, BUDGETS))
    if args.smoke:
        grid = grid[:2]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        curves = list(pool.map(lambda g: job(args.work, (args.max_steps, args.save_every), *g), grid))
    scores: dict[tuple[float, float], list[float]] = {}
    for (lr, beta, _, _), path in zip(grid, curves):
        scores.setdefault((lr, beta), []).append(primary(read_curve(path)))
    best = max(scores, key=lambda k: np.mean(scores[k]))
    print("| learning rate | β_KL | primary endpoint, static arm (mean ± sd over 3 seeds × 3 budgets) |")
    print("| ---: | ---: | ---: |")
    for (lr, beta), values in sorted(scores.items()):
        mark = " **(chosen)**" if (lr, beta) == best else ""
        sd = f"{np.std(values, ddof=1):.4f}" if len(values) > 1 else "—"
        print(f"| {lr:g} | {beta:g} | {np.mean(values):.4f} ± {sd}{mark} |")
    print()
    print(json.dumps({"learning_rate": best[0], "beta_kl": best[1], "seeds": SEEDS, "budgets": BUDGETS,
                      "n_eval": N_EVAL, "max_steps": args.max_steps, "save_every": args.save_every}))
    print()
    print("Static arm's mean reward per checkpoint under the SDE, chosen configuration (mean over seeds and budgets):")
    print()
    rows = [read_curve(path) for (lr, beta, _, _), path in zip(grid, curves) if (lr, beta) == best]
    steps = [step for step, sampler in rows[0].points if sampler == "sde" and step > 0]
    print("| reward | " + " | ".join(str(s) for s in steps) + " |")
    print("| --- | " + " | ".join("---:" for _ in steps) + " |")
    for j, name in enumerate(rows[0].scorers[:-1]):
        values = [np.mean([c.mean[k, j] for c in rows]) for k, (step, sampler) in enumerate(rows[0].points)
                  if sampler == "sde" and step > 0]
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main()

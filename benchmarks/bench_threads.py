"""Torch threads on this machine: the README's commands at 1, 2, … threads per process.

Each workload runs as a real ``recast`` process (threads are fixed when torch loads, so they
cannot be switched inside one process) with ``RECAST_THREADS=N``; this driver runs every
thread count back to back, ``--repeats`` times in turn, and prints best wall time per count
and its ratio to the first count. Workloads: ``recast train`` on the toy setting (the toy
SD3-architecture model, ``--max-steps 2``) and ``recast estimate`` on the toy model with
renderer positives. The rule in ``recast_cli/threads.py`` (a single process keeps torch's
default; processes sharing cores get one thread each) is chosen from these numbers; see
``docs/benchmarks.md``.

Run: .venv/bin/python benchmarks/bench_threads.py --threads 1,2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RECAST = [sys.executable, "-c", "from recast_cli.cli import main; main()"]


def workloads(tmp: Path) -> dict[str, list[str]]:
    positives = tmp / "positives"
    if not (positives / "manifest.parquet").is_file():
        subprocess.run([*RECAST, "sample-positive", "--setting", "toy", "--source", "renderer", "--n", "4",
                        "--out", str(positives)], check=True, capture_output=True, cwd=ROOT)
    return {
        "train (toy, 2 steps)": ["train", "--setting", "toy", "--weights", "static", "--max-steps", "2",
                                 "--quiet", "--out", str(tmp / "run-{n}-{r}")],
        "estimate (toy, T=10)": ["estimate", "--policy", str(ROOT / "pipelines" / "toy.toml"), "--rewards",
                                 "toy_color,toy_shape,toy_sharpness", "--positives", str(positives),
                                 "--sampling", "pplus", "--steps", "10", "--n", "4", "--k", "2", "--p", "4",
                                 "--out", str(tmp / "gains-{n}-{r}.parquet")],
    }


def run_once(args: list[str], threads: int, repeat: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["RECAST_THREADS"] = str(threads)
    argv = [a.format(n=threads, r=repeat) for a in args]
    t0 = time.perf_counter()
    done = subprocess.run([*RECAST, *argv], env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"recast {' '.join(argv[:1])} failed at {threads} threads:\n{done.stderr}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="thread counts to compare, the first is the baseline")
    ap.add_argument("--repeats", type=int, default=3, help="runs per count, best taken (interleaved)")
    opts = ap.parse_args()
    counts = [int(c) for c in opts.threads.split(",")]
    table = Table(title=f"best of {opts.repeats} (wall s; ratio to {counts[0]} thread(s)); {os.cpu_count()} CPUs")
    table.add_column("workload")
    for n in counts:
        table.add_column(f"{n} thr", justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in workloads(Path(tmp)).items():
            best = {n: float("inf") for n in counts}
            for r in range(max(1, opts.repeats)):
                for n in counts:
                    best[n] = min(best[n], run_once(args, n, r))
            table.add_row(name, *(f"{best[n]:.1f} s ({best[n] / best[counts[0]]:.2f}×)" for n in counts))
    Console().print(table)


if __name__ == "__main__":
    main()

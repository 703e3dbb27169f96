"""The ladder study's pilot (preregistration.md, "The learning-rate ladder"): static only, seeds
2000-2063, seven rates, the three non-control worlds; then the rule that places the rungs (amendment 1:
five rungs from static's most stable pilot rate up; the first registration's rule is reported beside it).

    python docs/results/ladder/pilot.py run     # recast study per pilot setting, two shards (resumable)
    python docs/results/ladder/pilot.py pick    # the lost-reward rate per world and rate → pilot.md, the ladder

The pick reads each pilot study's ``endpoints.csv`` (``recast report``: a plain CSV, one row per
cell and seed, ``lost`` = the number of rewards the seed lost at δ = 0.25), kept in ``pilot/``.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORLDS = ("independent", "conflict-mild", "conflict-strong")
OUT = ROOT / "artifacts" / "ladder-pilot"
KEPT = HERE / "pilot"  # every pilot seed's endpoints, committed: what ``pick`` reads
LEVEL = 0.10  # the first registration's rule: static's lost-reward rate at which the ladder's second rung sat
RUNGS = 5  # amendment 1: five rungs from static's most stable pilot rate up


def run() -> None:
    recast = [sys.executable, "-m", "recast_cli"]
    for world in WORLDS:
        setting = ROOT / "pipelines" / "ladder" / "pilot" / f"{world}.toml"
        out = OUT / world
        shards = [subprocess.Popen([*recast, "study", str(setting), "--out", str(out), "--shard", f"{i}/2", "--quiet"])
                  for i in range(2)]
        if any(p.wait() for p in shards):
            raise SystemExit(f"the pilot of {world} failed")
        # the report waits for both shards: write it once both are done, and keep its endpoints (committed)
        subprocess.run([*recast, "study", str(setting), "--out", str(out), "--quiet"], check=True)
        KEPT.mkdir(exist_ok=True)
        shutil.copyfile(out / "report" / "endpoints.csv", KEPT / f"{world}-endpoints.csv")


def pick() -> None:
    rows, rates = [], None
    for world in WORLDS:
        table = pd.read_csv(KEPT / f"{world}-endpoints.csv")
        lost = table.assign(any_lost=table["lost"] > 0).groupby("learning_rate")["any_lost"].agg(["mean", "size"])
        rates = sorted(lost.index)
        rows.append((world, lost))
    k_star = next((k for k, r in enumerate(rates) if rows[0][1].loc[r, "mean"] >= LEVEL), len(rates) - 1)
    literal = [0.01 * 2 ** (k / 2) for k in range(k_star - 1, k_star + 3)]  # the first registration's rule
    lost = [rows[0][1].loc[r, "mean"] for r in rates]
    k_min = min(range(len(rates)), key=lambda k: (lost[k], k))  # amendment 1: static's most stable pilot rate
    ladder = [0.01 * 2 ** (k / 2) for k in range(k_min, k_min + RUNGS)]
    lines = ["# The ladder study's pilot\n",
             "Written by `pilot.py pick` from the pilot studies (static only, seeds 2000–2063, 30 steps, G = 16). "
             "A seed lost a reward when a reward's final ODE value closed less than δ = 0.25 of its headroom over the "
             "base policy.\n",
             "| world | " + " | ".join(f"{r:g}" for r in rates) + " |",
             "|---|" + "---:|" * len(rates)]
    for world, lost in rows:
        lines.append(f"| {world} | " + " | ".join(f"{lost.loc[r, 'mean']:.3f} ({int(lost.loc[r, 'size'])})"
                                                   for r in rates) + " |")
    lines += ["", f"The first registration's rule: static's lost-reward rate in `independent` first reaches "
              f"{LEVEL:.0%} at k* = {k_star} (rate {rates[k_star]:g}), which gives k = {k_star - 1} … {k_star + 2}: "
              + ", ".join(f"{r:.6g}" for r in literal) + ". Amendment 1 (preregistration.md): static's lowest "
              f"lost-reward rate in `independent` is at k = {k_min} (rate {rates[k_min]:g}); the ladder is "
              f"k = {k_min} … {k_min + RUNGS - 1}: " + ", ".join(f"{r:.6g}" for r in ladder) + ".", ""]
    (HERE / "pilot.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print("python docs/results/ladder/worlds.py --ladder " + ",".join(f"{r:.6g}" for r in ladder))
    assert all(math.isfinite(r) for r in ladder)


if __name__ == "__main__":
    {"run": run, "pick": pick}[sys.argv[1]]()

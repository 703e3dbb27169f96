"""The weight each reward receives over the steps the trainer trains, before and after issue 15's fix.

    python docs/results/toy/received.py artifacts/toy > docs/results/toy/received.txt

For every W file of the study (solved with ``--skip-clean 1``: the trainer trains t = 2 … 10)
it prints Σ_{t trained} W_{i,t} / λ̂_i, the share of reward i's budget that reaches a trained
step, next to the same share for the W that the same gain table gives when it is solved over
all T = 10 columns, as the pipeline did before the fix (t = 1's column is then lost).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from recast_cli.artifacts import lambda_hat, read_gains, read_weights  # noqa: E402
from recast_cli.grid import GridSpec  # noqa: E402
from recast_cli.solve.sinkhorn import resample_gains, solve_weights  # noqa: E402


def main(root: Path) -> None:
    table = read_gains(root / "gains.parquet")
    print(f"gain table {root / 'gains.parquet'}: rewards {', '.join(table.rewards)}; standardised by "
          f"{table.meta.get('reward_std_source')}")
    print("share of each reward's budget on the trained steps t = 2 … 10 (received / λ̂):\n")
    print(f"| W | λ | {' | '.join(f'{r} after' for r in table.rewards)} | "
          f"{' | '.join(f'{r} before' for r in table.rewards)} |")
    print("|---|---|" + "---:|" * (2 * len(table.rewards)))
    for path in sorted((root / "W").glob("*.safetensors")):
        w = read_weights(path)
        lam = np.asarray(w.lam)
        grid = GridSpec.from_json(table.meta["grid"], str(root / "gains.parquet")).sigmas(w.T)
        before = solve_weights(resample_gains(table.sigmas, table.gain, grid), lam, mode=w.mode).W
        trained = np.array(w.steps) - 1
        after_share = w.W[:, trained].sum(axis=1) / lambda_hat(lam)
        before_share = before[:, trained].sum(axis=1) / lambda_hat(lam)
        cells = [f"{x:.3f}" for x in (*after_share, *before_share)]
        print(f"| {w.mode} | ({','.join(f'{x:g}' for x in lam)}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/toy"))

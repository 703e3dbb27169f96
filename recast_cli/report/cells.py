"""The report of ``recast study``: endpoints, contrasts and the mechanism from ``recast.cell/1`` tables.

The endpoints are the 1-D world's (``statistics.primary`` and ``secondary``, applied to each seed's
curve), so a study run by the batched engine reads like the two-timescale report, per group size G:

* **Primary endpoint** of a seed: the mean over its SDE checkpoints of the aggregate Σ_i λ_i·r_i
  (the area under the curve up to a constant), averaged over the budgets λ.
* **Secondary**: the aggregate at the last checkpoint under the ODE sampler.
* **Contrasts**: arm − static per seed (every arm of a seed shares its noise, and every policy is
  evaluated on the same samples), mean, sd, 95% t-interval, two-sided sign test.
* **Mechanism**: per arm, the PPO clip fraction and the gradient norm over training, and the spread
  of the first iteration's gradient over seeds (all seeds start from one network, so it is the
  gradient estimator's own variance) beside its mean's squared norm.

Every seed's endpoints are written beside the Markdown as ``endpoints.csv``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recast_cli.artifacts import CELL_SCHEMA, CellTable, artifact_schema, read_cell
from recast_cli.errors import BadInput
from recast_cli.report.build import Report
from recast_cli.report.inputs import Budget, budget_label, holds_schema
from recast_cli.report.statistics import contrasts, primary, secondary
from recast_cli.report.tables import fixed, markdown_table, table_contrasts

ENDPOINTS = "endpoints.csv"


def is_cell_input(paths: Sequence[str | Path]) -> bool:
    """True when the inputs are ``recast.cell/1`` tables (``recast study``)."""
    return holds_schema(paths, CELL_SCHEMA)


def load_cells(paths: Sequence[str | Path]) -> list[CellTable]:
    """Every input as a cell table, checked to be one study (one setting, rewards, n); BadInput otherwise."""
    cells = []
    for p in map(Path, paths):
        if not p.is_file() or artifact_schema(p)[0] != CELL_SCHEMA:
            raise BadInput(f"{p}: the report of a study reads recast.cell/1 tables only (one per cell)")
        cells.append(read_cell(p))
    keys = [(c.label, tuple(c.meta["lambda"]), c.meta["group_size"]) for c in cells]
    if len(set(keys)) != len(keys):
        raise BadInput("two cell tables hold the same arm, budget and group size")
    for what in ("rewards", "n"):
        if len({repr(c.meta[what]) for c in cells}) > 1:
            raise BadInput(f"the cells disagree on {what}: they are not one study")
    return sorted(cells, key=lambda c: (c.meta["group_size"], c.meta["lambda"], c.label))


def endpoints(cell: CellTable) -> dict[int, tuple[float | None, float | None]]:
    """Seed → (primary, secondary) of one cell."""
    return {s: (primary(cell.curve(s)), secondary(cell.curve(s))) for s in cell.seeds}


def build_cell_report(cells: Sequence[CellTable]) -> tuple[Report, bytes]:
    """The Markdown of the study and its per-seed endpoints (CSV), in memory."""
    first = cells[0]
    arms = list(dict.fromkeys(c.label for c in cells))
    if "static" in arms:
        arms.remove("static")
        arms.insert(0, "static")
    sizes = sorted({c.meta["group_size"] for c in cells})
    budgets = sorted({tuple(c.meta["lambda"]) for c in cells})
    seeds = sorted({s for c in cells for s in c.seeds})
    values = {(c.label, tuple(c.meta["lambda"]), c.meta["group_size"]): endpoints(c) for c in cells}
    parts = ["# recast study report — the 1-D world, batched\n",
             f"Setting `{first.meta['setting']['name']}`; rewards {', '.join(first.rewards)}; arms {', '.join(arms)}; "
             f"budgets {', '.join(budget_label(b) for b in budgets)}; group sizes {', '.join(map(str, sizes))} at "
             f"{first.meta['group_size'] * first.meta['prompts_per_step']} rollouts per step; {len(seeds)} seeds; "
             f"n = {first.meta['n']} evaluation samples per checkpoint, the same for every seed, arm and step.\n"]
    for g in sizes:
        for title, index, what in (
                ("Primary endpoint — mean aggregate over the SDE checkpoints", 0,
                 "A seed's value is the mean of Σ_i λ_i·r_i over its checkpoints under the training sampler."),
                ("Secondary endpoint — final aggregate (ODE)", 1,
                 "A seed's value is Σ_i λ_i·r_i at its last checkpoint under the ODE sampler.")):
            parts.append(f"## G = {g}: {title}\n")
            parts.append(what + " Mean ± sd over seeds per budget:\n")
            rows = []
            for b in budgets:
                row = [budget_label(b)]
                for arm in arms:
                    v = [x[index] for x in values.get((arm, b, g), {}).values() if x[index] is not None]
                    row.append("—" if not v else f"{fixed(np.mean(v), 4)} ± "
                               f"{fixed(np.std(v, ddof=1), 4) if len(v) > 1 else '—'} (n = {len(v)})")
                rows.append(row)
            parts.append(markdown_table(["λ", *arms], rows))
            items, _ = contrasts(seed_grid(values, g, index), [a for a in arms if a != "static"])
            if items:
                parts.append("Paired per seed (each seed's difference averaged over the budgets), 95% t-interval "
                             "and the two-sided sign test over seeds (ties dropped):\n")
                parts.append(table_contrasts(items))
        parts.append(f"## G = {g}: mechanism\n")
        parts.append(table_mechanism([c for c in cells if c.meta["group_size"] == g], arms))
    parts.append("## Cells\n")
    parts.append(markdown_table(["cell", "arm", "λ", "G", "seeds", "W sha256"],
                                [[Path(str(c.meta["weights"])).stem + f"-g{c.meta['group_size']}", c.label,
                                  budget_label(tuple(c.meta["lambda"])), str(c.meta["group_size"]), str(len(c.seeds)),
                                  (c.provenance.sources[-1].sha256[:12]
                                                                         if c.provenance and c.provenance.sources else "—")]
                                 for c in cells]))
    parts.append(f"\nEvery seed's endpoints: [`{ENDPOINTS}`]({ENDPOINTS}) (its first line is recast's mark; "
                 "`pandas.read_csv(path, skiprows=1)`).\n")
    lines = ["arm,lambda,group_size,seed,primary,secondary"]
    for (arm, b, g), per_seed in sorted(values.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        for s, (p, q) in sorted(per_seed.items()):
            lines.append(f"{arm},{budget_label(b)},{g},{s},{_num(p)},{_num(q)}")
    return Report("\n".join(parts), ()), ("\n".join(lines) + "\n").encode()


def _num(x: float | None) -> str:
    return "" if x is None else repr(float(x))


def seed_grid(values, g: int, index: int) -> dict[tuple[str, Budget, int], float]:
    """(arm, λ, seed) → endpoint ``index`` (0 primary, 1 secondary) at group size ``g``, for
    ``statistics.contrasts``; a seed without that endpoint is left out."""
    return {(arm, b, s): x[index] for (arm, b, size), per_seed in values.items() if size == g
            for s, x in per_seed.items() if x[index] is not None}


def table_mechanism(cells: Sequence[CellTable], arms: Sequence[str]) -> str:
    """Per arm (over its cells): clip fraction, gradient norm, and the first gradient's mean and spread."""
    rows = []
    for arm in arms:
        mine = [c for c in cells if c.label == arm]
        if not mine:
            continue
        clip = np.concatenate([c.train["clip_frac"].reshape(-1) for c in mine])
        norm = np.concatenate([c.train["grad_norm"].reshape(-1) for c in mine])
        signal = [c.meta["gradient"]["mean_sq_norm"] for c in mine]
        spread = [c.meta["gradient"]["spread"] for c in mine if c.meta["gradient"]["spread"] is not None]
        rows.append([arm, fixed(float(clip.mean()), 4), fixed(float(clip.max()), 4), fixed(float(np.median(norm)), 4),
                     f"{np.mean(signal):.4g}", f"{np.mean(spread):.4g}" if spread else "—",
                     f"{np.mean(signal) / np.mean(spread):.4g}" if spread and np.mean(spread) > 0 else "—"])
    return markdown_table(["arm", "clip fraction (mean)", "clip fraction (max)", "grad norm (median)",
                           "|E g₁|²", "E|g₁ − E g₁|²", "ratio"], rows) + \
        "\ng₁: the first iteration's gradient before clipping, over the cell's seeds (one network at the start).\n"


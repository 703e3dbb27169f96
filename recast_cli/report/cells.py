"""The report of ``recast study``: endpoints, contrasts and the mechanism from ``recast.cell/1`` tables.

The endpoints are the 1-D world's (``statistics.primary`` and ``secondary``, applied to each seed's
curve), so a study run by the batched engine reads like the two-timescale report, per group size G
(and learning rate):

* **Primary endpoint** of a seed: the mean over its SDE checkpoints of the aggregate Σ_i λ_i·r_i
  (the area under the curve up to a constant), averaged over the budgets λ.
* **Secondary**: the aggregate at the last checkpoint under the ODE sampler.
* **Contrasts**: arm − static per seed (every arm of a seed shares its noise, and every policy is
  evaluated on the same samples), mean, sd, 95% t-interval, two-sided sign test.
* **Every reward** (``report.rewards``): per arm, the share of seeds that lost a reward, which reward,
  the worst-reward endpoint and each reward's final value; McNemar's test against static.
* **Mechanism**: per arm, the PPO clip fraction and the gradient norm over training, and the spread
  of the first iteration's gradient over seeds (all seeds start from one network, so it is the
  gradient estimator's own variance) beside its mean's squared norm; each reward's gradient
  signal-to-noise at four iterations (``train.stacked_gradients``).

A study over a learning-rate ladder (``[study] learning_rate_ladder``) gets these per G and rate.
Every seed's endpoints are written beside the Markdown as ``endpoints.csv``, a plain CSV.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pathlib import Path

import numpy as np

from recast_cli.artifacts import CELL_SCHEMA, CellTable, artifact_schema, read_cell
from recast_cli.artifacts.cells import DEFAULT_LOST_DELTA
from recast_cli.errors import BadInput
from recast_cli.report.build import Report
from recast_cli.report.inputs import Budget, budget_label, holds_schema
from recast_cli.report.statistics import contrasts, primary, secondary
from recast_cli.report.rewards import endpoints_csv, seed_rewards, table_lost, table_reward_snr, table_stalls
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
    keys = [(c.label, tuple(c.meta["lambda"]), c.meta["group_size"], rate_of(c)) for c in cells]
    if len(set(keys)) != len(keys):
        raise BadInput("two cell tables hold the same arm, budget, group size and learning rate")
    for what in ("rewards", "n"):
        if len({repr(c.meta[what]) for c in cells}) > 1:
            raise BadInput(f"the cells disagree on {what}: they are not one study")
    return sorted(cells, key=lambda c: (c.meta["group_size"], rate_of(c) or 0.0, c.meta["lambda"], c.label))


def endpoints(cell: CellTable) -> dict[int, tuple[float | None, float | None]]:
    """Seed → (primary, secondary) of one cell."""
    return {s: (primary(cell.curve(s)), secondary(cell.curve(s))) for s in cell.seeds}


def rate_of(cell: CellTable) -> float | None:
    """The cell's learning rate when it is a rung of a learning-rate ladder (the report's conditions are then
    G × rate); None for a cell at its arm's own rate (one condition per G: the arms are compared across rates)."""
    return float(cell.meta["learning_rate"]) if cell.meta.get("rung") else None


def build_cell_report(cells: Sequence[CellTable], lost_delta: float = DEFAULT_LOST_DELTA) -> tuple[Report, bytes]:
    """The Markdown of the study and its per-seed endpoints (CSV), in memory: per condition (G, and the
    learning rate when the study has several), the endpoints, the contrasts, the per-reward endpoints
    (``report.rewards``: lost rewards with threshold ``lost_delta``) and the mechanism."""
    first = cells[0]
    arms = list(dict.fromkeys(c.label for c in cells))
    if "static" in arms:
        arms.remove("static")
        arms.insert(0, "static")
    conditions = sorted({(c.meta["group_size"], rate_of(c)) for c in cells}, key=lambda x: (x[0], x[1] or 0.0))
    budgets = sorted({tuple(c.meta["lambda"]) for c in cells})
    seeds = sorted({s for c in cells for s in c.seeds})
    key = {id(c): (c.label, tuple(c.meta["lambda"]), c.meta["group_size"], rate_of(c)) for c in cells}
    values = {key[id(c)]: endpoints(c) for c in cells}
    per_reward = {key[id(c)]: seed_rewards(c, lost_delta) for c in cells}
    parts = ["# recast study report — the 1-D world, batched\n",
             f"Setting `{first.meta['setting']['name']}`; rewards {', '.join(first.rewards)}; arms {', '.join(arms)}; "
             f"budgets {', '.join(budget_label(b) for b in budgets)}; group sizes "
             f"{', '.join(map(str, sorted({g for g, _ in conditions})))} at "
             f"{first.meta['group_size'] * first.meta['prompts_per_step']} rollouts per step; "
             f"learning rates {', '.join(f'{r:g}' for r in sorted({_rate(c) for c in cells}))}; {len(seeds)} seeds; "
             f"n = {first.meta['n']} evaluation samples per checkpoint, the same for every seed, arm and step. "
             f"A reward is lost when its final ODE value closes less than δ = {lost_delta:g} of its headroom "
             "over the base policy (docs/report.md).\n"]
    for g, rate in conditions:
        where = f"G = {g}" + (f", learning rate {rate:g}" if rate is not None else "")
        mine = {k: v for k, v in values.items() if k[2:] == (g, rate)}
        for title, index, what in (
                ("Primary endpoint — mean aggregate over the SDE checkpoints", 0,
                 "A seed's value is the mean of Σ_i λ_i·r_i over its checkpoints under the training sampler."),
                ("Secondary endpoint — final aggregate (ODE)", 1,
                 "A seed's value is Σ_i λ_i·r_i at its last checkpoint under the ODE sampler.")):
            parts.append(f"## {where}: {title}\n")
            parts.append(what + " Mean ± sd over seeds per budget:\n")
            parts.append(table_budgets(mine, budgets, arms, index))
            items, _ = contrasts(seed_grid(mine, index), [a for a in arms if a != "static"])
            if items:
                parts.append("Paired per seed (each seed's difference averaged over the budgets), 95% t-interval "
                             "and the two-sided sign test over seeds (ties dropped):\n")
                parts.append(table_contrasts(items))
        for b in budgets:
            parts.append(f"## {where}: every reward, λ = {budget_label(b)}\n")
            parts.append(table_lost({arm: per_reward[(arm, b, g, rate)] for arm in arms
                                     if (arm, b, g, rate) in per_reward}, first.rewards))
            parts.append(table_stalls({c.label: c for c in cells if key[id(c)][1:] == (b, g, rate)}))
        here = [c for c in cells if key[id(c)][2:] == (g, rate)]
        parts.append(f"## {where}: mechanism\n")
        parts.append(table_mechanism(here, arms))
        parts.append(table_reward_snr(here, arms))
    parts.append("## Cells\n")
    parts.append(markdown_table(["cell", "arm", "λ", "G", "rate", "seeds", "W sha256"],
                                [[Path(str(c.meta["weights"])).stem + f"-g{c.meta['group_size']}" +
                                  (f"-lr{rate_of(c):g}" if rate_of(c) is not None else ""), c.label,
                                  budget_label(tuple(c.meta["lambda"])), str(c.meta["group_size"]), f"{_rate(c):g}",
                                  str(len(c.seeds)),
                                  (c.provenance.sources[-1].sha256[:12] if c.provenance and c.provenance.sources else "—")]
                                 for c in cells]))
    parts.append(f"\nEvery seed's endpoints, every reward's final values and normalised gains: [`{ENDPOINTS}`]"
                 f"({ENDPOINTS}) (`pandas.read_csv(path)`).\n")
    rows = [(c, _rate(c), values[key[id(c)]], per_reward[key[id(c)]])
            for c in sorted(cells, key=lambda c: (c.meta["group_size"], _rate(c), c.meta["lambda"], c.label))]
    return Report("\n".join(parts), ()), endpoints_csv(rows)


def _rate(cell: CellTable) -> float:
    """The learning rate the cell trained at (a cell of a recast before issue 42: its recorded [train])."""
    return float(cell.meta.get("learning_rate", cell.meta.get("train", {}).get("learning_rate", math.nan)))


def table_budgets(values, budgets, arms, index: int) -> str:
    """Endpoint ``index`` per budget (rows) and arm (columns): mean ± sd over seeds (n)."""
    rows = []
    for b in budgets:
        row = [budget_label(b)]
        for arm in arms:
            v = [x[index] for k, per_seed in values.items() if k[:2] == (arm, b) for x in per_seed.values()
                 if x[index] is not None]
            row.append("—" if not v else f"{fixed(np.mean(v), 4)} ± "
                       f"{fixed(np.std(v, ddof=1), 4) if len(v) > 1 else '—'} (n = {len(v)})")
        rows.append(row)
    return markdown_table(["λ", *arms], rows)


def seed_grid(values, index: int) -> dict[tuple[str, Budget, int], float]:
    """(arm, λ, seed) → endpoint ``index`` (0 primary, 1 secondary) of one condition's cells, for
    ``statistics.contrasts``; a seed without that endpoint is left out."""
    return {(key[0], key[1], s): x[index] for key, per_seed in values.items()
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


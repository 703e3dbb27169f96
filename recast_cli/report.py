"""``recast report``: the paper's tables and figures from what stage 2 wrote (METHOD.md §7).

Inputs, any mix (docs/report.md):

* ``recast.eval/1`` tables (``recast evaluate``) → Tables 1 and 2 (base / static / no-Sink /
  ReCAST, mean ± std over training seeds, win counts over matched (λ, seed) pairs), Table 4
  (aggregate per λ), Tables 7–10 (per λ, with a Pareto verdict) and the sample grids;
* ``recast.run/1`` folders (``recast train``) → Fig. 1 from the run's W, training curves;
* ``recast.gains/1`` tables of the base policy and of trained checkpoints → Table 6, Fig. 5;
* ``recast.judgements/1`` files (``recast judge``) → Table 3 (position-debiased win rates).

Everything is read and checked before anything is written. ``report.md`` depends only on the
artifacts' contents — no timestamps, no absolute paths, everything sorted, numbers in fixed
formats — so regenerating it from the same artifacts gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import typer

from recast_cli.artifacts import (
    EVAL_SCHEMA,
    GAINS_SCHEMA,
    EvalTable,
    GainTable,
    WeightMatrix,
    _decode_metadata,
    atomic_write_bytes,
    check_writable,
    read_eval,
    read_gains,
    read_weights,
    sha256_file,
)
from recast_cli.errors import BadInput

RUN_SCHEMA = "recast.run/1"  # written by train/trainer.py (not imported: it pulls in torch)
JUDGEMENTS_SCHEMA = "recast.judgements/1"
REPORT_NAME = "report.md"

MODES = ("base", "static", "nosink", "recast", "reversed")
TRAINED = ("static", "nosink", "recast", "reversed")
MODE_LABEL = {"base": "base", "static": "static", "nosink": "no-Sink", "recast": "ReCAST", "reversed": "reversed"}
AGGREGATE = "Aggregate r"  # the row / column of r = Σ_i λ_i·r_i (a space: never a scorer name)
VERDICT_TIE = "equal"

Budget = tuple[float, ...]


# --------------------------------------------------------------------------- inputs


class Evaluated:
    """What an evaluation table says it evaluated (its ``table.meta``): mode, λ and training seed."""

    table: Any

    @property
    def mode(self) -> str:
        return self.table.meta["mode"]

    @property
    def budget(self) -> Budget:
        return tuple(float(x) for x in self.table.meta["lambda"])

    @property
    def seed(self) -> int | None:
        return self.table.meta["train_seed"]


@dataclass(frozen=True)
class Evaluation(Evaluated):
    """One ``recast.eval/1`` table: what was evaluated (mode, λ, training seed) and its scores."""

    name: str
    path: Path
    table: EvalTable
    sha256: str

    @property
    def step(self) -> int | None:
        return (self.table.meta["checkpoint"] or {}).get("step")

    def means(self, budget: Budget | None = None) -> dict[str, float]:
        """Mean over the images of every scorer, and of the aggregate with ``budget`` (default: the table's λ)."""
        values = {name: float(self.table.scores[:, j].mean()) for j, name in enumerate(self.table.scorers)}
        lam = np.asarray(budget if budget is not None else self.budget, dtype=np.float64)
        rewards = np.stack([self.table.column(r) for r in self.table.meta["rewards"]], axis=1)
        values[AGGREGATE] = float((rewards @ lam).mean())
        return values


@dataclass(frozen=True)
class Run:
    """A ``recast.run/1`` folder: its mode, λ, seed and σ grid, its W and its aggregate per step."""

    name: str
    path: Path
    mode: str
    budget: Budget
    seed: int | None
    setting: str
    rewards: tuple[str, ...]
    sigmas: tuple[float, ...]
    weights: WeightMatrix | None
    curve: dict[int, float]
    sha256: str


@dataclass(frozen=True)
class Gains:
    """A ``recast.gains/1`` table; ``checkpoint`` names the trained policy it was estimated at (None: base)."""

    name: str
    path: Path
    table: GainTable
    checkpoint: str | None
    sha256: str

    @property
    def label(self) -> str:
        if self.checkpoint is None:
            return "base policy"
        folder = Path(self.checkpoint)
        step = re.fullmatch(r"step-0*(\d+)", folder.name)
        if step and folder.parent.name == "checkpoints":
            return f"{folder.parent.parent.name} step {step.group(1)}"
        return folder.name


@dataclass(frozen=True)
class Judgements:
    """A ``recast.judgements/1`` file: one verdict per (pair, order) and criterion."""

    name: str
    path: Path
    rows: tuple[dict[str, Any], ...]
    criteria: tuple[str, ...]
    labels: tuple[str, str] | None
    sha256: str


@dataclass
class Inputs:
    evals: list[Evaluation] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    gains: list[Gains] = field(default_factory=list)
    judgements: list[Judgements] = field(default_factory=list)


def load_inputs(paths: Sequence[str | Path]) -> Inputs:
    """Read every input by its kind: an eval, gain or judgement table, or a run folder; BadInput otherwise."""
    inputs = Inputs()
    seen: dict[Path, Path] = {}
    for given in map(Path, paths):
        if not given.exists():
            raise BadInput(f"{given}: no such file or folder")
        if given.resolve() in seen:
            raise BadInput(f"{given} is given twice")
        seen[given.resolve()] = given
        kind = input_kind(given)
        if kind == RUN_SCHEMA:
            inputs.runs.append(_read_run(given))
        elif kind == EVAL_SCHEMA:
            inputs.evals.append(Evaluation(given.name, given, read_eval(given), sha256_file(given)))
        elif kind == GAINS_SCHEMA:
            table = read_gains(given)
            checkpoint = (table.meta.get("policy") or {}).get("checkpoint")
            inputs.gains.append(Gains(given.name, given, table, checkpoint, sha256_file(given)))
        else:
            inputs.judgements.append(_read_judgements(given))
    # a fixed order, whatever the order of the arguments: tables, figures and messages follow it
    inputs.evals.sort(key=lambda e: (MODES.index(e.mode), e.budget, e.seed is None, e.seed or 0, e.name, e.sha256))
    inputs.runs.sort(key=lambda r: (MODES.index(r.mode), r.budget, r.seed is None, r.seed or 0, r.name, r.sha256))
    inputs.gains.sort(key=lambda g: (g.checkpoint is not None, g.label, g.name, g.sha256))
    inputs.judgements.sort(key=lambda j: (j.name, j.sha256))
    return inputs


def input_kind(path: Path) -> str:
    """The schema tag of a report input; BadInput for anything the report does not read."""
    readable = "recast report reads recast.eval/1, recast.gains/1 and recast.judgements/1 files and recast.run/1 folders"
    if path.is_dir():
        record = path / "run.json"
        tag = _json_file(record).get("schema") if record.is_file() else None
        if tag != RUN_SCHEMA:
            raise BadInput(f"{path}: a folder without a recast.run/1 run.json; {readable}")
        return RUN_SCHEMA
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata
    except (pa.ArrowException, OSError):
        raise BadInput(f"{path}: not a Parquet file; {readable}") from None
    tag = _decode_metadata(metadata, str(path)).get("schema")
    if tag not in (EVAL_SCHEMA, GAINS_SCHEMA, JUDGEMENTS_SCHEMA):
        raise BadInput(f"{path}: an input of kind {tag or 'unknown'}; {readable}")
    return tag


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput(f"{path}: not a JSON file") from None
    if not isinstance(value, dict):
        raise BadInput(f"{path}: not a JSON object")
    return value


def _read_run(folder: Path) -> Run:
    record = _json_file(folder / "run.json")
    where = str(folder / "run.json")
    try:
        mode, rewards, lam, sigmas = record["mode"], record["rewards"], record["lambda"], record["sigmas"]
        setting = record["config"]["setting"]
        seed = record["config"].get("train", {}).get("seed")
        budget = tuple(float(x) for x in lam)
        grid = tuple(float(s) for s in sigmas)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise BadInput(f"{where}: not a recast.run/1 record (needs mode, rewards, lambda, sigmas, config.setting)") \
            from None
    if mode not in TRAINED:
        raise BadInput(f"{where}: mode {mode!r} is not one of {', '.join(TRAINED)}")
    weights = read_weights(folder / "weights.safetensors") if (folder / "weights.safetensors").is_file() else None
    curve: dict[int, float] = {}
    if (folder / "metrics.parquet").is_file():
        from recast_cli.train.metrics import read_metrics

        metrics = read_metrics(folder / "metrics.parquet")
        for step, value in zip(metrics.column("step").to_pylist(), metrics.column("aggregate").to_pylist()):
            if value is not None:
                curve.setdefault(int(step), float(value))
    return Run(folder.name, folder, mode, budget, seed, str(setting), tuple(map(str, rewards)), grid, weights, curve,
               sha256_file(folder / "run.json"))


def _read_judgements(path: Path) -> Judgements:
    import pyarrow.parquet as pq

    arrow = pq.read_table(path)
    meta = _decode_metadata(arrow.schema.metadata, str(path))
    fixed = {"pair", "order", "prompt", "image_a", "image_b", "reply"}
    missing = {"pair", "order", "overall"} - set(arrow.column_names)
    if missing:
        raise BadInput(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    criteria = tuple(c for c in arrow.column_names if c not in fixed)
    rows = tuple(arrow.to_pylist())
    if not rows:
        raise BadInput(f"{path}: no verdicts")
    orders: dict[int, list[str]] = {}
    for row in rows:
        orders.setdefault(row["pair"], []).append(row["order"])
        bad = [c for c in criteria if row[c] not in ("a", "b", "tie")]
        if bad:
            raise BadInput(f"{path}: pair {row['pair']} has verdict {row[bad[0]]!r} for {bad[0]!r} (a, b or tie)")
    for pair, seen in sorted(orders.items()):
        if sorted(seen) != ["ab", "ba"]:
            raise BadInput(f"{path}: pair {pair} is not judged once in each order (has {', '.join(sorted(seen))}); "
                           "Table 3 needs both presentation orders")
    labels = (meta.get("config") or {}).get("labels")
    labels = tuple(map(str, labels)) if isinstance(labels, list) and len(labels) == 2 else None
    return Judgements(path.name, path, rows, criteria, labels, sha256_file(path))


# --------------------------------------------------------------------------- checks


def check_inputs(inputs: Inputs) -> None:
    """One setting, one σ grid, one sampling configuration, no duplicate, something to report; else BadInput."""
    trained = [e for e in inputs.evals if e.mode != "base"]
    if not (trained or inputs.runs or inputs.gains or inputs.judgements):
        only = " (only base evaluations given)" if inputs.evals else ""
        raise BadInput(f"nothing to report{only}: give evaluations of trained runs, run folders, gain tables "
                       "or judgement files")

    settings: list[tuple[str, tuple[str, str]]] = []
    for e in inputs.evals:
        setting = e.table.meta["setting"] or {}
        settings.append((e.name, (str(setting.get("name")), str(setting.get("path")))))
    settings += [(r.name, (Path(r.setting).stem, r.setting)) for r in inputs.runs]
    for g in inputs.gains:
        setting = (g.table.meta.get("policy") or {}).get("setting")
        if setting:
            settings.append((g.name, (Path(setting).stem, str(setting))))
    for name, key in settings[1:]:
        if key != settings[0][1]:
            first, (n0, p0) = settings[0]
            raise BadInput(f"{name} is from setting {key[0]!r} ({key[1]}), {first} from {n0!r} ({p0}); "
                           "one report covers one setting")

    rewards = [(e.name, tuple(e.table.meta["rewards"])) for e in inputs.evals] + \
              [(r.name, r.rewards) for r in inputs.runs]
    for name, names in rewards[1:]:
        if names != rewards[0][1]:
            raise BadInput(f"{name} has rewards {list(names)}, {rewards[0][0]} {list(rewards[0][1])}")

    grids = [(e.name, tuple(float(s) for s in e.table.meta["sigmas"] or ())) for e in trained] + \
            [(r.name, r.sigmas) for r in inputs.runs]
    for name, grid in grids[1:]:
        first, grid0 = grids[0]
        if len(grid) != len(grid0) or not np.allclose(grid, grid0, rtol=1e-9, atol=1e-12):
            raise BadInput(f"{name} is trained on another σ grid (T = {len(grid) - 1}) than {first} "
                           f"(T = {len(grid0) - 1}); runs of different W grids cannot share one table")

    def sampling(e: Evaluation) -> str:
        return json.dumps([e.table.meta["sampling"], e.table.meta["prompts_source"]], sort_keys=True)

    reference = trained[0] if trained else (inputs.evals[0] if inputs.evals else None)
    for e in inputs.evals:
        if sampling(e) != sampling(reference):
            what = "base evaluation" if e.mode == "base" else "evaluation"
            raise BadInput(f"{e.name}: {what} sampled with {e.table.meta['sampling']} "
                           f"(prompts {e.table.meta['prompts_source']}), {reference.name} with "
                           f"{reference.table.meta['sampling']} (prompts {reference.table.meta['prompts_source']}); "
                           "their images are not comparable")

    _unique(inputs.evals, lambda e: (e.mode, e.budget, e.seed), "evaluations of",
            lambda e: "the base model" if e.mode == "base" else
            f"{MODE_LABEL[e.mode]} λ = {budget_label(e.budget)} seed {e.seed}")
    _unique(inputs.runs, lambda r: (r.mode, r.budget, r.seed), "runs of",
            lambda r: f"{MODE_LABEL[r.mode]} λ = {budget_label(r.budget)} seed {r.seed}")
    _unique(inputs.gains, lambda g: g.label, "gain tables of", lambda g: g.label)
    if inputs.gains:
        first = inputs.gains[0]
        for g in inputs.gains[1:]:
            if set(g.table.rewards) != set(first.table.rewards) or g.table.meta["alpha"] != first.table.meta["alpha"]:
                raise BadInput(f"{g.name} (rewards {list(g.table.rewards)}, α = {g.table.meta['alpha']}) and "
                               f"{first.name} (rewards {list(first.table.rewards)}, α = {first.table.meta['alpha']}) "
                               "are not comparable gain tables")


def _unique(items: Iterable[Any], key: Callable[[Any], Any], what: str, describe: Callable[[Any], str]) -> None:
    seen: dict[Any, Any] = {}
    for item in items:
        other = seen.setdefault(key(item), item)
        if other is not item:
            raise BadInput(f"two {what} {describe(item)}: {other.name} and {item.name}")


# --------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (ddof 1) of per-seed values; std None for a single value."""

    mean: float
    std: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        arr = np.asarray(values, dtype=np.float64)
        return cls(float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else None)


def fixed(x: float, decimals: int) -> str:
    text = f"{x:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text  # never "-0.000"


def show(stat: Stat | None, decimals: int) -> str:
    if stat is None:
        return "—"
    return fixed(stat.mean, decimals) + ("" if stat.std is None else f" ± {fixed(stat.std, decimals)}")


def decimals_for(values: Iterable[float]) -> int:
    """Three decimals; two for a scorer whose scale is an order of magnitude larger (as HPSv3 in the paper)."""
    return 2 if max((abs(v) for v in values), default=0.0) >= 10 else 3


def budget_label(budget: Budget) -> str:
    return "(" + ",".join(f"{x:g}" for x in budget) + ")"


def budget_slug(budget: Budget) -> str:
    return "-".join(f"{x:g}".replace(".", "p") for x in budget)


def pareto(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """ReCAST vs static over the per-scorer means: dominates, is dominated, trade-off or equal."""
    ours_arr, theirs_arr = np.asarray(ours), np.asarray(theirs)
    if np.array_equal(ours_arr, theirs_arr):
        return VERDICT_TIE
    if np.all(ours_arr >= theirs_arr):
        return "ReCAST ≻ static"
    if np.all(ours_arr <= theirs_arr):
        return "static ≻ ReCAST"
    return "trade-off"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the evaluation grid


class Grid:
    """Per-evaluation means keyed by (mode, λ, seed), and the base model's means per λ (METHOD.md §7)."""

    def __init__(self, evals: Sequence[Evaluation]):
        trained = [e for e in evals if e.mode != "base"]
        self.cells = {(e.mode, e.budget, e.seed): e.means() for e in trained}
        self.budgets = sorted({e.budget for e in trained})
        self.modes = [m for m in TRAINED if any(e.mode == m for e in trained)]
        base = [e for e in evals if e.mode == "base"]
        self.base = {b: base[0].means(b) for b in self.budgets} if base and self.budgets else {}
        self.rewards = list(evals[0].table.meta["rewards"]) if evals else []
        judges = [list(e.table.meta.get("judges") or ()) for e in trained]
        self.judges = [j for j in judges[0] if all(j in js for js in judges)] if judges else []
        self.dropped_judges = sorted({j for js in judges for j in js} - set(self.judges))

    def seeds(self, mode: str, budget: Budget | None = None) -> list[int]:
        return sorted({s for (m, b, s) in self.cells if m == mode and (budget is None or b == budget)},
                      key=lambda s: (s is None, s))

    def stat(self, mode: str, scorer: str, budget: Budget) -> Stat | None:
        """Mean ± std over the seeds of one λ."""
        values = [self.cells[(mode, budget, s)][scorer] for s in self.seeds(mode, budget)]
        return Stat.of(values) if values else None

    def pooled(self, mode: str, scorer: str) -> Stat | None:
        """Mean ± std over seeds of each seed's mean over the λ it was evaluated at (Tables 1, 2)."""
        per_seed = []
        for s in self.seeds(mode):
            values = [self.cells[(mode, b, s)][scorer] for b in self.budgets if (mode, b, s) in self.cells]
            per_seed.append(float(np.mean(values)))
        return Stat.of(per_seed) if per_seed else None

    def base_value(self, scorer: str) -> Stat | None:
        if not self.base or scorer not in self.base[self.budgets[0]]:
            return None
        return Stat(float(np.mean([self.base[b][scorer] for b in self.budgets])), None)

    def matched(self) -> list[tuple[Budget, int]]:
        """The (λ, seed) pairs with both a static and a ReCAST evaluation."""
        return sorted((b, s) for (m, b, s) in self.cells if m == "recast" and ("static", b, s) in self.cells)

    def wins(self, scorer: str) -> tuple[int, int]:
        pairs = self.matched()
        won = sum(self.cells[("recast", b, s)][scorer] > self.cells[("static", b, s)][scorer] for b, s in pairs)
        return won, len(pairs)

    def decimals(self, scorer: str) -> int:
        values = [c[scorer] for c in self.cells.values() if scorer in c]
        values += [c[scorer] for c in self.base.values() if scorer in c]
        return decimals_for(values)

    def missing(self) -> list[str]:
        """The (mode, λ, seed) evaluations an incomplete grid lacks."""
        seeds = sorted({s for (_, _, s) in self.cells}, key=lambda s: (s is None, s))
        return [f"{MODE_LABEL[m]} λ = {budget_label(b)} seed {s}" for m in self.modes for b in self.budgets
                for s in seeds if (m, b, s) not in self.cells]


def _bold_pair(cells: dict[str, str], stats: dict[str, Stat | None], decimals: int) -> None:
    """Bold the better of static and ReCAST at the shown precision, both when they agree (the paper's rule)."""
    if stats.get("static") is None or stats.get("recast") is None:
        return
    ours, theirs = (float(fixed(stats[m].mean, decimals)) for m in ("recast", "static"))
    for mode in ("recast", "static"):
        if (ours >= theirs) if mode == "recast" else (theirs >= ours):
            cells[mode] = f"**{cells[mode]}**"


def table_pooled(grid: Grid, scorers: Sequence[str], first: str) -> str:
    """Tables 1 and 2: rows of scorers; columns base / static / no-Sink / ReCAST and ReCAST's wins."""
    modes = (["base"] if grid.base else []) + grid.modes
    compare = "static" in grid.modes and "recast" in grid.modes
    header = [first, *(MODE_LABEL[m] for m in modes)] + (["ReCAST wins"] if compare else [])
    rows = []
    for scorer in scorers:
        decimals = grid.decimals(scorer)
        stats = {m: grid.base_value(scorer) if m == "base" else grid.pooled(m, scorer) for m in modes}
        cells = {m: show(stats[m], decimals) for m in modes}
        _bold_pair(cells, stats, decimals)
        row = [scorer, *(cells[m] for m in modes)]
        if compare:
            won, total = grid.wins(scorer)
            row.append(f"{won} of {total}" if total else "—")
        rows.append(row)
    return markdown_table(header, rows)


def table_aggregate_per_budget(grid: Grid) -> str:
    """Table 4: the aggregate per λ for static, no-Sink and ReCAST, and its mean over λ."""
    decimals = grid.decimals(AGGREGATE)
    header = ["method", *(budget_label(b) for b in grid.budgets), "mean"]
    rows = []
    for mode in grid.modes:
        stats = [grid.stat(mode, AGGREGATE, b) for b in grid.budgets]
        present = [s.mean for s in stats if s is not None]
        mean = fixed(float(np.mean(present)), decimals) if len(present) == len(stats) else "—"
        rows.append([MODE_LABEL[mode], *(show(s, decimals) for s in stats), mean])
    return markdown_table(header, rows)


def table_per_budget(grid: Grid, scorers: Sequence[str], with_aggregate: bool) -> str:
    """Tables 7–10: per λ, static and ReCAST rows over the scorers, and the Pareto verdict over them."""
    columns = ([AGGREGATE] if with_aggregate else []) + list(scorers)
    modes = [m for m in ("static", "recast") if m in grid.modes]
    header = ["λ", "method", *columns, "Pareto"]
    rows = []
    for budget in grid.budgets:
        stats = {(m, c): grid.stat(m, c, budget) for m in modes for c in columns}
        verdict = "—"
        if all(stats.get((m, c)) is not None for m in ("static", "recast") for c in scorers):
            verdict = pareto([stats[("recast", c)].mean for c in scorers], [stats[("static", c)].mean for c in scorers])
        cells = {(m, c): show(stats[(m, c)], grid.decimals(c)) for m in modes for c in columns}
        for c in columns:
            pair = {m: cells[(m, c)] for m in modes}
            _bold_pair(pair, {m: stats[(m, c)] for m in modes}, grid.decimals(c))
            cells.update({(m, c): pair[m] for m in modes})
        for mode in modes:
            if any(stats[(mode, c)] is not None for c in columns):
                rows.append([budget_label(budget), MODE_LABEL[mode], *(cells[(mode, c)] for c in columns), verdict])
    return markdown_table(header, rows, ["l", "l", *(["r"] * len(columns)), "l"])


# --------------------------------------------------------------------------- Table 3


@dataclass(frozen=True)
class JudgeColumn:
    header: str
    order: tuple[Any, ...]
    rates: dict[str, float]
    pairs: int


def judge_columns(judgements: Sequence[Judgements], evals: Sequence[Evaluation]) -> tuple[list[JudgeColumn], list[str]]:
    """Table 3: per file, ReCAST's win rate per criterion, both orders counted: (wins + ½·ties) / verdicts."""
    images: dict[Path, tuple[str, Budget]] = {}
    for e in evals:
        for im in e.table.images:
            images[(e.path.parent / im.image_path).resolve()] = (e.mode, e.budget)
    columns = []
    for j in judgements:
        side, budget, opponent = _recast_side(j, images)
        rates = {}
        for criterion in j.criteria:
            verdicts = [row[criterion] for row in j.rows]
            wins = sum(v == side for v in verdicts) + 0.5 * sum(v == "tie" for v in verdicts)
            rates[criterion] = wins / len(verdicts)
        header = budget_label(budget) if budget is not None else Path(j.name).stem
        if opponent != "static":
            header += f" vs {MODE_LABEL.get(opponent, opponent)}"
        order = (0, budget) if budget is not None else (1, ())
        columns.append(JudgeColumn(header, (*order, header, j.name), rates, len({r["pair"] for r in j.rows})))
    counts: dict[str, int] = {}
    for c in columns:
        counts[c.header] = counts.get(c.header, 0) + 1
    columns = [JudgeColumn(f"{c.header} ({c.order[-1]})" if counts[c.header] > 1 else c.header, c.order, c.rates,
                           c.pairs) for c in columns]
    columns.sort(key=lambda c: c.order)
    criteria = list(dict.fromkeys(["overall", *(k for c in columns for k in c.rates)]))
    return columns, criteria


def _recast_side(j: Judgements, images: dict[Path, tuple[str, Budget]]) -> tuple[str, Budget | None, str]:
    """Which side ('a' or 'b') is ReCAST, its λ (when the images are the evaluations' own) and the opponent."""
    found: dict[str, set[tuple[str, Budget]]] = {"a": set(), "b": set()}
    if all(j.rows[0].get(k) is not None for k in ("image_a", "image_b")):
        for row in j.rows:
            for side in ("a", "b"):
                text = Path(row[f"image_{side}"])
                candidates = [text] if text.is_absolute() else [Path.cwd() / text, j.path.parent / text]
                hit = next((images[c.resolve()] for c in candidates if c.resolve() in images), None)
                found[side].add(hit)
    if all(len(found[s]) == 1 and None not in found[s] for s in "ab"):
        (mode_a, budget_a), (mode_b, budget_b) = next(iter(found["a"])), next(iter(found["b"]))
        if (mode_a == "recast") != (mode_b == "recast"):
            side = "a" if mode_a == "recast" else "b"
            return side, budget_a if side == "a" else budget_b, mode_b if side == "a" else mode_a
    if j.labels is not None:
        kinds = [_label_mode(label) for label in j.labels]
        if kinds.count("recast") == 1:
            side = "a" if kinds[0] == "recast" else "b"
            other = kinds[1] if side == "a" else kinds[0]
            return side, None, other or j.labels[1 if side == "a" else 0]
    raise BadInput(f"{j.name}: cannot tell which side is ReCAST: its images are not those of the evaluations given "
                   "and its labels are not recast and static (recast judge --label-a recast --label-b static)")


def _label_mode(label: str) -> str | None:
    word = re.sub(r"[\s_\-]", "", label.lower())
    return {"recast": "recast", "ours": "recast", "static": "static", "nosink": "nosink", "base": "base"}.get(word)


def table_judge(columns: Sequence[JudgeColumn], criteria: Sequence[str]) -> str:
    header = ["criterion", *(c.header for c in columns)] + (["mean"] if len(columns) > 1 else [])
    rows = []
    for criterion in criteria:
        rates = [c.rates.get(criterion) for c in columns]
        row = [criterion.capitalize(), *("—" if r is None else fixed(r, 4) for r in rates)]
        if len(columns) > 1:
            present = [r for r in rates if r is not None]
            row.append(fixed(float(np.mean(present)), 4))
        rows.append(row)
    pairs = [str(c.pairs) for c in columns]
    rows.append(["pairs", *pairs] + ([str(sum(c.pairs for c in columns))] if len(columns) > 1 else []))
    return markdown_table(header, rows)


# --------------------------------------------------------------------------- Table 6


def table_gains(gains: Sequence[Gains]) -> str:
    """Table 6: Σ_t ΔD_{i,t} (= D_{i,0}, E5) per reward at the base policy and at trained checkpoints."""
    ordered = sort_gains(gains)
    base = ordered[0] if ordered[0].checkpoint is None else None
    trained = [g for g in ordered if g.checkpoint is not None]
    rewards = list(ordered[0].table.rewards)
    totals = {g.label: dict(zip(g.table.rewards, g.table.total_gain().tolist())) for g in ordered}
    header = ["reward", *(g.label for g in ordered)]
    if base is not None:
        header += [f"remaining ({g.label})" for g in trained]
    rows = []
    for reward in [*rewards, None]:
        values = {g.label: sum(totals[g.label].values()) if reward is None else totals[g.label][reward]
                  for g in ordered}
        row = ["all rewards" if reward is None else reward, *(fixed(values[g.label], 3) for g in ordered)]
        if base is not None:
            before = values[base.label]
            row += [f"{fixed(values[g.label] / before, 2)}×" if before > 0 else "—" for g in trained]
        rows.append(row)
    return markdown_table(header, rows)


def sort_gains(gains: Sequence[Gains]) -> list[Gains]:
    return sorted(gains, key=lambda g: (g.checkpoint is not None, g.label))


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figure:
    file: str
    caption: str
    png: bytes


def _render(draw: Callable[[], Any]) -> bytes:
    """Draw under fixed rcParams and save without metadata that changes between runs (dates, versions)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"font.family": "DejaVu Sans", "font.size": 9, "figure.dpi": 100,
                                "savefig.dpi": 110, "path.simplify": True, "svg.hashsalt": "recast",
                                "axes.prop_cycle": matplotlib.rcParamsDefault["axes.prop_cycle"]}):
        fig = draw()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        plt.close(fig)
    return buffer.getvalue()


def figures_weights(runs: Sequence[Run]) -> list[Figure]:
    """Fig. 1 for every distinct W of the ReCAST and no-Sink runs (static W are flat)."""
    from recast_cli.figures import figure_from_artifacts

    found: dict[tuple[str, Budget], dict[str, WeightMatrix]] = {}
    for run in runs:
        if run.weights is not None and run.mode in ("recast", "nosink", "reversed"):
            found.setdefault((run.mode, run.budget), {})[_digest(run.weights)] = run.weights
    figures = []
    for (mode, budget), by_key in sorted(found.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1])):
        for k, key in enumerate(sorted(by_key)):
            w = by_key[key]
            suffix = f"-{k + 1}" if len(by_key) > 1 else ""
            file = f"fig1-{mode}-lambda-{budget_slug(budget)}{suffix}.png"
            title = f"{MODE_LABEL[mode]} W, λ = {budget_label(budget)}, T = {w.T}"
            png = _render(lambda w=w, title=title: figure_from_artifacts(weights=w, title=title))
            figures.append(Figure(file, f"Fig. 1 — {title}: per-step gain ΔD, mean-normalised gain and W "
                                        "(t/T from clean to noisy).", png))
    return figures


def _digest(w: WeightMatrix) -> str:
    return hashlib.sha256(np.ascontiguousarray(w.W).tobytes() + np.ascontiguousarray(w.gain).tobytes()).hexdigest()


def figure_training_curves(runs: Sequence[Run]) -> Figure | None:
    """Aggregate training reward per step, static vs no-Sink vs ReCAST per λ, mean over seeds (± std band)."""
    with_curves = [r for r in runs if r.curve]
    if not with_curves:
        return None
    budgets = sorted({r.budget for r in with_curves})

    def draw() -> Any:
        import matplotlib.pyplot as plt

        cols = min(len(budgets), 3)
        rows = math.ceil(len(budgets) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
        for ax, budget in zip(axes.ravel(), budgets):
            for mode in TRAINED:
                curves = [r.curve for r in with_curves if r.budget == budget and r.mode == mode]
                if not curves:
                    continue
                steps = sorted(set.intersection(*(set(c) for c in curves)))
                values = np.array([[c[s] for s in steps] for c in curves])
                mean = values.mean(axis=0)
                (line,) = ax.plot(steps, mean, lw=1.4, label=f"{MODE_LABEL[mode]} ({len(curves)} seeds)")
                if len(curves) > 1:
                    std = values.std(axis=0, ddof=1)
                    ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
            ax.set_title(f"λ = {budget_label(budget)}")
            ax.set_xlabel("training step")
            ax.set_ylabel("aggregate Σλ·r (training batch)")
            ax.grid(alpha=0.3)
            ax.legend(frameon=False, fontsize=8)
        for ax in axes.ravel()[len(budgets):]:
            ax.set_visible(False)
        fig.tight_layout()
        return fig

    return Figure("training-curves.png", "Training curves — aggregate training reward Σ_i λ_i·mean r_i of each "
                                         "step's batch, mean over seeds (band: ± std over seeds).", _render(draw))


def figures_samples(evals: Sequence[Evaluation], prompts: int) -> tuple[list[Figure], list[str]]:
    """Per λ: static (left) and ReCAST (right) images of the same prompts and sampling seeds, lowest training seed."""
    from PIL import Image

    by_key = {(e.mode, e.budget, e.seed): e for e in evals if e.mode in ("static", "recast")}
    figures, notes = [], []
    for budget in sorted({b for (_, b, _) in by_key}):
        seeds = sorted(s for (m, b, s) in by_key if m == "recast" and b == budget and ("static", b, s) in by_key)
        if not seeds or prompts < 1:
            continue
        static, ours = by_key[("static", budget, seeds[0])], by_key[("recast", budget, seeds[0])]
        theirs = {(im.prompt_id, im.seed): im for im in static.table.images}
        common = sorted((im.prompt_id, im.seed) for im in ours.table.images if (im.prompt_id, im.seed) in theirs)
        first = {}
        for prompt_id, seed in common:
            first.setdefault(prompt_id, seed)
        ids = sorted(first)
        if not ids:
            continue
        chosen = sorted({ids[i] for i in np.linspace(0, len(ids) - 1, min(prompts, len(ids))).round().astype(int)})
        ours_images = {(im.prompt_id, im.seed): im for im in ours.table.images}
        picks = [(theirs[(p, first[p])], ours_images[(p, first[p])]) for p in chosen]
        try:
            pixels = [tuple(np.asarray(Image.open(e.path.parent / im.image_path).convert("RGB"))
                            for e, im in ((static, a), (ours, b))) for a, b in picks]
        except (OSError, ValueError) as exc:  # a missing or unreadable image leaves this grid out, not the report
            notes.append(f"no sample grid for λ = {budget_label(budget)}: {type(exc).__name__} reading the images "
                         f"of {static.name} / {ours.name}")
            continue

        def draw(picks: Any = picks, pixels: Any = pixels) -> Any:
            import textwrap

            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(len(picks), 2, figsize=(5.2, 2.5 * len(picks)), squeeze=False)
            for r, ((im, _), images) in enumerate(zip(picks, pixels)):
                for c, image in enumerate(images):
                    ax = axes[r, c]
                    ax.imshow(image, interpolation="nearest")
                    ax.set_xticks([])
                    ax.set_yticks([])
                    if r == 0:
                        ax.set_title(("static", "ReCAST")[c])
                axes[r, 0].set_ylabel(textwrap.fill(im.prompt[:90], 26), fontsize=7)
            fig.tight_layout()
            return fig

        caption = (f"Samples, λ = {budget_label(budget)}, training seed {seeds[0]}: static (left) vs ReCAST (right), "
                   "the same prompt and sampling seed per row (prompts " + ", ".join(str(p) for p in chosen) + ").")
        figures.append(Figure(f"samples-lambda-{budget_slug(budget)}.png", caption, _render(draw)))
    return figures, notes


def figure_d_curves(gains: Sequence[Gains]) -> Figure:
    """Fig. 5: D_{i,t} per reward at the base policy and at the trained checkpoints, on one vertical axis."""
    ordered = sort_gains(gains)

    def draw() -> Any:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ordered), figsize=(5.0 * len(ordered), 3.8), sharey=True, squeeze=False)
        for ax, g in zip(axes[0], ordered):
            x = np.arange(g.table.T + 1) / g.table.T
            for i, reward in enumerate(g.table.rewards):
                ax.plot(x, g.table.D[i], marker="o", ms=2.5, lw=1.3, label=reward)
            ax.set_title(g.label)
            ax.set_xlim(0, 1)
            ax.set_xlabel("t / T   (clean → noisy)")
            ax.axhline(0.0, color="0.6", lw=0.8)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("D$_{i,t}$ (D$_T$ = 0)")
        axes[0][0].legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return fig

    return Figure("fig5-d-curves.png", "Fig. 5 — cumulative discriminability D_{i,t} at "
                  + ", ".join(g.label for g in ordered) + " (shared vertical axis).", _render(draw))


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Report:
    markdown: str
    figures: tuple[Figure, ...]


def build_report(inputs: Inputs, prompts: int = 4) -> Report:
    """The Markdown and the PNGs, in memory (checked inputs; nothing is written here)."""
    grid = Grid(inputs.evals)
    parts = ["# ReCAST report\n"]
    parts.append(_header(inputs, grid))
    parts.append(_inputs_table(inputs))
    notes: list[str] = []
    figures: list[Figure] = []

    if grid.cells:
        seeds = sorted({s for (_, _, s) in grid.cells}, key=lambda s: (s is None, s))
        scope = f"{len(grid.budgets)} budgets × {len(seeds)} seeds, {len(grid.matched())} matched (λ, seed) pairs"
        parts.append(f"## Table 1 — training rewards ({scope})\n")
        parts.append("Each seed's value is the mean over its evaluation's images, averaged over the budgets it was "
                     "evaluated at; entries are the mean ± std over seeds. Aggregate r = Σ_i λ_i·r_i with the integer "
                     "λ of each budget (base: averaged over the same budgets). Bold: the better of static and ReCAST "
                     "at the shown precision. ReCAST wins: matched (λ, seed) pairs where ReCAST's mean is higher.\n")
        parts.append(table_pooled(grid, [AGGREGATE, *grid.rewards], "training reward"))
        if grid.judges:
            parts.append(f"## Table 2 — held-out judges ({scope})\n")
            parts.append(table_pooled(grid, grid.judges, "held-out judge"))
        if grid.dropped_judges:
            notes.append("judges not in every evaluation, left out of the tables: " + ", ".join(grid.dropped_judges))
        notes += [f"incomplete grid: no evaluation of {m}" for m in grid.missing()]

    if inputs.judgements:
        columns, criteria = judge_columns(inputs.judgements, inputs.evals)
        parts.append("## Table 3 — pairwise judge, ReCAST vs static\n")
        parts.append("ReCAST's win rate (wins + ½·ties over all verdicts), every pair judged in both presentation "
                     "orders (position-debiased); 0.5 is parity.\n")
        parts.append(table_judge(columns, criteria))

    if grid.cells:
        parts.append("## Table 4 — aggregate training reward per budget\n")
        parts.append(table_aggregate_per_budget(grid))
        parts.append("## Tables 7/8 — training rewards per budget\n")
        parts.append("Pareto: ReCAST vs static over the per-reward means (not the aggregate).\n")
        parts.append(table_per_budget(grid, grid.rewards, with_aggregate=True))
        if grid.judges:
            parts.append("## Tables 9/10 — held-out judges per budget\n")
            parts.append(table_per_budget(grid, grid.judges, with_aggregate=False))

    figures += figures_weights(inputs.runs)
    curves = figure_training_curves(inputs.runs)
    if curves is not None:
        figures.append(curves)
    samples, sample_notes = figures_samples(inputs.evals, prompts)
    figures += samples
    notes += sample_notes

    if inputs.gains:
        parts.append("## Table 6 — total discriminability gain before and after training\n")
        parts.append("Σ_t ΔD_{i,t} (= D_{i,0}, E5): the divergence left between each policy and the reward's "
                     "positive distribution; remaining = trained / base.\n")
        parts.append(table_gains(inputs.gains))
        figures.append(figure_d_curves(inputs.gains))

    if figures:
        parts.append("## Figures\n")
        parts.append("\n".join(f"![{f.file}]({f.file})\n\n{f.caption}\n" for f in figures))
    if notes:
        parts.append("## Notes\n")
        parts.append("".join(f"* {n}\n" for n in notes))
    return Report("\n".join(parts), tuple(figures))


def _header(inputs: Inputs, grid: Grid) -> str:
    lines = []
    settings = [e.table.meta["setting"]["name"] for e in inputs.evals] + [Path(r.setting).stem for r in inputs.runs]
    if settings:
        lines.append(f"Setting `{settings[0]}`.")
    if grid.rewards:
        lines.append("Training rewards: " + ", ".join(grid.rewards) + "; held-out judges: "
                     + (", ".join(grid.judges) or "none") + ".")
    if inputs.evals:
        e = inputs.evals[0]
        s = e.table.meta["sampling"]
        prompts = len({im.prompt_id for im in e.table.images})
        lines.append(f"Evaluations: {prompts} prompts × {s.get('n')} images, ODE sampling with {s.get('steps')} steps, "
                     f"CFG {s.get('guidance_scale')}, resolution {s.get('resolution')}, seed {s.get('seed')}.")
    lines.append("Standard deviations are sample standard deviations (ddof 1) over training seeds.")
    return "\n".join(lines) + "\n"


def _inputs_table(inputs: Inputs) -> str:
    rows = []
    for e in inputs.evals:
        rows.append(((0, MODES.index(e.mode), e.budget, e.seed is None, e.seed or 0, e.name),
                     [e.name, "evaluation", MODE_LABEL[e.mode], budget_label(e.budget) if e.mode != "base" else "—",
                      "—" if e.seed is None else str(e.seed), "—" if e.step is None else str(e.step), e.sha256[:12]]))
    for r in inputs.runs:
        last = max(r.curve) if r.curve else None
        rows.append(((1, MODES.index(r.mode), r.budget, r.seed is None, r.seed or 0, r.name),
                     [r.name, "run", MODE_LABEL[r.mode], budget_label(r.budget),
                      "—" if r.seed is None else str(r.seed), "—" if last is None else str(last), r.sha256[:12]]))
    for g in inputs.gains:
        rows.append(((2, g.checkpoint is not None, (), False, 0, g.label, g.name),
                     [g.name, "gains", g.label, "—", "—", "—", g.sha256[:12]]))
    for j in inputs.judgements:
        rows.append(((3, 0, (), False, 0, j.name), [j.name, "judgements", "—", "—", "—", "—", j.sha256[:12]]))
    rows.sort(key=lambda item: item[0])
    header = ["input", "kind", "what", "λ", "train seed", "step", "sha256"]
    return "## Inputs\n\n" + markdown_table(header, [row for _, row in rows], ["l"] * len(header))


def write_report(report: Report, out_dir: Path) -> list[Path]:
    written = []
    for figure in report.figures:
        atomic_write_bytes(out_dir / figure.file, figure.png)
        written.append(out_dir / figure.file)
    atomic_write_bytes(out_dir / REPORT_NAME, report.markdown.encode("utf-8"))
    return [out_dir / REPORT_NAME, *written]


def make_report(paths: Sequence[str | Path], out_dir: str | Path, prompts: int = 4) -> list[Path]:
    """Read and check every input, build the report in memory, then write ``out_dir/report.md`` and the PNGs."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: not a directory")
    check_writable(out / REPORT_NAME, inputs=list(paths))
    if prompts < 0:
        raise BadInput(f"--prompts must be >= 0, got {prompts}")
    from recast_cli.report_curves import is_curve_input, make_curve_report

    if is_curve_input(paths):  # the 1-D world (flow1d): curve tables instead of per-image evaluations
        return make_curve_report(paths, out)
    inputs = load_inputs(paths)
    check_inputs(inputs)
    return write_report(build_report(inputs, prompts), out)


# --------------------------------------------------------------------------- CLI


def report_command(
    inputs: list[Path] = typer.Argument(..., help="Evaluation tables (recast.eval/1), run folders (recast.run/1), "
                                                  "gain tables (recast.gains/1) and judgement files "
                                                  "(recast.judgements/1), in any mix."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for report.md and the figures (PNG)."),
    prompts: int = typer.Option(4, "--prompts", help="Prompts per sample grid (0: no sample grids)."),
) -> None:
    """Stage 2: the paper's tables and figures (Tables 1-4, 6-10; Fig. 1, 5; curves; samples) as Markdown + PNG."""
    from rich.console import Console

    written = make_report(inputs, out_dir, prompts=prompts)
    Console().print(f"wrote {written[0]} and {len(written) - 1} figures", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``report`` to the ``recast`` app."""
    app.command("report")(report_command)


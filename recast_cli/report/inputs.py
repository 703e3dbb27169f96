"""A report's inputs: each artifact read by its kind, put in a fixed order and checked together."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts import (
    CURVE_SCHEMA, EVAL_SCHEMA, GAINS_SCHEMA, JUDGEMENTS_SCHEMA, RUN_SCHEMA, WEIGHTS_SCHEMA, CurveTable, EvalTable,
    GainTable, WeightMatrix, artifact_schema, current_tag, decode_metadata, json_loads, read_curve, read_eval,
    read_gains, read_judgements, read_run, read_weights, sha256_file,
)
from recast_cli.errors import BadInput
from recast_cli.train.stall import StallSpan, recorded_stalls

#: the order a report lists arms in (trained arms: the W modes of artifacts.MODES, plus the base model)
ARM_ORDER = ("static", "nosink", "recast", "reversed")
MODE_ORDER = ("base", *ARM_ORDER)
MODE_LABEL = {"base": "base", "static": "static", "nosink": "no-Sink", "recast": "ReCAST", "reversed": "reversed"}
AGGREGATE = "Aggregate r"  # the row / column of r = Σ_i λ_i·r_i (a space: never a scorer name)

Budget = tuple[float, ...]


def budget_label(budget: Budget) -> str:
    return "(" + ",".join(f"{x:g}" for x in budget) + ")"


def budget_slug(budget: Budget) -> str:
    return "-".join(f"{x:g}".replace(".", "p") for x in budget)


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
    """A ``recast.run/1`` folder: its mode, λ, seed, σ grid, W, aggregate per step and stalls (``train/stall``)."""

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
    stalls: dict[str, StallSpan] | None = None


@dataclass(frozen=True)
class Gains:
    """A ``recast.gains/2`` table; ``checkpoint`` names the trained policy it was estimated at (None: base)."""

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


def sort_gains(gains: Sequence[Gains]) -> list[Gains]:
    """The base policy first, then the trained checkpoints by label."""
    return sorted(gains, key=lambda g: (g.checkpoint is not None, g.label))


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
    inputs.evals.sort(key=lambda e: (MODE_ORDER.index(e.mode), e.budget, e.seed is None, e.seed or 0, e.name, e.sha256))
    inputs.runs.sort(key=lambda r: (MODE_ORDER.index(r.mode), r.budget, r.seed is None, r.seed or 0, r.name, r.sha256))
    inputs.gains.sort(key=lambda g: (g.checkpoint is not None, g.label, g.name, g.sha256))
    inputs.judgements.sort(key=lambda j: (j.name, j.sha256))
    return inputs


def input_kind(path: Path) -> str:
    """The schema tag of a report input; BadInput for anything the report does not read."""
    readable = "recast report reads recast.eval/1, recast.gains/2 and recast.judgements/1 files and recast.run/1 folders"
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
    tag = current_tag(decode_metadata(metadata, str(path)).get("schema"))
    if tag not in (EVAL_SCHEMA, GAINS_SCHEMA, JUDGEMENTS_SCHEMA):
        raise BadInput(f"{path}: an input of kind {tag or 'unknown'}; {readable}")
    return tag


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json_loads(path.read_text(), str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput(f"{path}: not a JSON file") from None
    if not isinstance(value, dict):
        raise BadInput(f"{path}: not a JSON object")
    return value


def _read_run(folder: Path) -> Run:
    record = read_run(folder)  # BadInput naming what is wrong with run.json
    seed = record.config.get("train", {}).get("seed") if isinstance(record.config.get("train"), dict) else None
    mode, rewards, setting = record.mode, record.rewards, record.setting
    budget = tuple(float(x) for x in record.lam)
    grid = tuple(float(s) for s in record.sigmas)
    weights = read_weights(folder / "weights.safetensors") if (folder / "weights.safetensors").is_file() else None
    curve: dict[int, float] = {}
    stalls = None
    if (folder / "metrics.parquet").is_file():
        from recast_cli.artifacts.metrics import read_metrics

        metrics = read_metrics(folder / "metrics.parquet")
        for step, value in zip(metrics.column("step").to_pylist(), metrics.column("aggregate").to_pylist()):
            if value is not None:
                curve.setdefault(int(step), float(value))
        stalls = recorded_stalls(metrics.to_pydict())
    return Run(folder.name, folder, mode, budget, seed, str(setting), tuple(map(str, rewards)), grid, weights, curve,
               sha256_file(folder / "run.json"), stalls)


def _read_judgements(path: Path) -> Judgements:
    arrow = read_judgements(path)
    meta = decode_metadata(arrow.schema.metadata, str(path))
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


def recast_side(j: Judgements, evals: Sequence[Evaluation]) -> tuple[str, Budget | None, str]:
    """Which side ('a' or 'b') is ReCAST, its λ (when the images are the evaluations' own) and the opponent."""
    images: dict[Path, tuple[str, Budget]] = {}
    for e in evals:
        for im in e.table.images:
            images[(e.path.parent / im.image_path).resolve()] = (e.mode, e.budget)
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


# --------------------------------------------------------------------------- the 1-D world's inputs


@dataclass(frozen=True)
class Curve(Evaluated):
    """One ``recast.curve/1`` table and what it evaluated (mode, λ, training seed)."""

    name: str
    table: CurveTable
    sha256: str


@dataclass
class CurveInputs:
    """Curve tables; the W of the run folders, in the folders' order; gain tables and W files by name."""

    curves: list[Curve]
    runs: list[WeightMatrix]
    gains: list[tuple[str, GainTable]]
    weights: list[tuple[str, WeightMatrix]]


def holds_schema(paths: Sequence[str | Path], schema: str) -> bool:
    """True when a file among the inputs declares ``schema`` (unreadable files are skipped here)."""
    for p in map(Path, paths):
        if p.is_file():
            try:
                if artifact_schema(p)[0] == schema:
                    return True
            except BadInput:
                continue
    return False


def is_curve_input(paths: Sequence[str | Path]) -> bool:
    """True when the inputs hold a ``recast.curve/1`` table: the report of the 1-D world."""
    return holds_schema(paths, CURVE_SCHEMA)


def load_curve_inputs(paths: Sequence[str | Path]) -> CurveInputs:
    """Curve, gain and W files and run folders, in a fixed order; BadInput for anything else or no curve table."""
    inputs = CurveInputs([], [], [], [])
    runs: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise BadInput(f"{p}: no such file or folder")
        if p.resolve() in seen:
            raise BadInput(f"{p} is given twice")
        seen.add(p.resolve())
        if p.is_dir():
            if not (p / "run.json").is_file():
                raise BadInput(f"{p}: a folder without run.json; the 1-D report reads curve, gain and weight files "
                               "and run folders")
            runs.append(p)
            continue
        tag = artifact_schema(p)[0]
        if tag == CURVE_SCHEMA:
            inputs.curves.append(Curve(p.name, read_curve(p), sha256_file(p)))
        elif tag == GAINS_SCHEMA:
            inputs.gains.append((p.name, read_gains(p)))
        elif tag == WEIGHTS_SCHEMA:
            inputs.weights.append((p.name, read_weights(p)))
        else:
            raise BadInput(f"{p}: an input of kind {tag or 'unknown'}; the 1-D report reads recast.curve/1, "
                           "recast.gains/2 and recast.weights/1 files and recast.run/1 folders")
    if not inputs.curves:
        raise BadInput("no recast.curve/1 table among the inputs")
    keys = [(c.mode, c.budget, c.seed, tuple(c.table.points)) for c in inputs.curves]
    if len(set(keys)) != len(keys):
        raise BadInput("two curve tables evaluate the same run at the same points")
    inputs.curves.sort(key=lambda c: (("base", *ARM_ORDER).index(c.mode), c.budget, c.seed or 0, c.name))
    inputs.gains.sort(key=lambda g: g[0])
    inputs.weights.sort(key=lambda w: w[0])
    inputs.runs = [read_weights(run / "weights.safetensors") for run in sorted(runs)
                   if (run / "weights.safetensors").is_file()]
    return inputs

"""``recast study SETTING``: a flow1d setting's whole ``[study]`` on the batched engine, cell by cell.

    exact gains (and the sampled estimate at the base policy, when an arm or the report needs it)
      →  solve-w for every budget × arm          (OUT/gains/, OUT/W/: the artifacts of the stages)
      →  every budget × arm × group size: one cell of all the study's seeds, trained and evaluated
         as one batched computation (``train.stacked``)  →  OUT/cells/NAME.parquet (recast.cell/1)
      →  ``recast report OUT/cells`` (the endpoints, the contrasts and the mechanism per arm)

A cell file is written atomically when the cell is done, and a cell whose file exists is not run
again: a study killed at any moment resumes where it stopped, losing at most the cell in flight.

A file is reused only when everything that determined it is equal: each cell holds the digest of
each of its inputs (the world, the policy, the recipe, the evaluation, the seeds, the W and the
``[study]`` options that made it, the cell format) in its metadata, and ``OUT/study.json`` holds
those of the gain tables and W files (written before they are computed, so a resumed estimate's
parts are of the same inputs too). Another one is refused, one line naming what changed;
``--force`` recomputes it instead, replacing only recast's own files.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from recast_cli.artifacts import (CELL_SCHEMA, GAINS_SCHEMA, SCORES_SCHEMA, WEIGHTS_SCHEMA, CellTable, claim_output,
                                  finish_parts, parts_dir, read_cell, read_weights, write_cell)
from recast_cli.artifacts.cells import CELL_FORMAT, MADE_FROM, TRAIN_QUANTITIES
from recast_cli.artifacts.io import atomic_write_bytes
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.artifacts.outputs import refuse_foreign_file
from recast_cli.errors import BadInput
from recast_cli.policy.world1d import World1D
from recast_cli.setting.load import Setting, digest, file_digest, load_setting, policy_inputs, world_of
from recast_cli.study.spec import ESTIMATE_KEYS, EXACT_KEYS, ArmSpec, StudySpec, load_study
from recast_cli.train.config import STALL_KEYS, TrainConfig, config_from_setting, skip_clean_of, trained_steps

#: ``OUT/study.json``: the digests of the inputs of every gain table and W file of the study
RECORD_NAME = "study.json"
RECORD_SCHEMA = "recast.study-inputs/1"


@dataclass(frozen=True)
class CellPlan:
    """One cell to run: its file, the arm, the budget, G (and P = rollouts / G), the W file, the recipe."""

    name: str
    path: Path
    arm: ArmSpec
    budget: tuple[float, ...]
    group_size: int
    weights: Path
    cfg: TrainConfig
    rung: bool = False  # a rung of [study] learning_rate_ladder: the report sets its cells apart by rate


@dataclass(frozen=True)
class StudyPlan:
    setting: Setting
    study: StudySpec
    out: Path
    cells: tuple[CellPlan, ...]
    seeds: tuple[int, ...]
    eval_n: int
    eval_seed: int


def plan_study(setting_name: str, out: Path, seeds: tuple[int, ...] | None = None,
               overrides: list[str] | None = None) -> StudyPlan:
    """Check the setting's study for the batched engine and list its cells (nothing is written)."""
    from recast_cli.evaluate.config import config_from_setting as eval_config
    from recast_cli.train.config import apply_overrides, check_config

    setting = load_setting(setting_name)
    if setting.policy.kind != "flow1d":
        raise BadInput(f"recast study runs the batched engine of the 1-D world (a flow1d policy); {setting.name} is "
                       f"{setting.policy.kind!r}: use `make all SETTING={setting.name}` for its study")
    study = load_study(setting)
    base = apply_overrides(config_from_setting(setting), overrides or [], {})
    check_config(base)
    planned = study.cells(base, setting.file.name)  # the study's one plan (the Make graph runs the same)
    evaluation, _ = eval_config(setting)
    out = Path(out)
    cells = tuple(CellPlan(c.name, out / "cells" / f"{c.name}.parquet", c.arm, c.budget, c.group_size,
                           out / "W" / f"{c.weights_name}.safetensors",
                           replace(base, lam=c.budget, learning_rate=c.learning_rate, group_size=c.group_size,
                                   prompts_per_step=c.prompts_per_step), c.rung)
                  for c in planned)
    return StudyPlan(setting, study, out, cells, tuple(seeds or study.seeds), study.eval_n or evaluation.n,
                     evaluation.seed)


def cell_footprint(plan: StudyPlan) -> tuple[dict[str, int], int]:
    """The counts that size one cell of the batched engine (seeds, rollouts per step, T, hidden width),
    and the bytes it holds at its peak, an upper estimate from the arrays ``batched/engine.py``
    allocates (E = seeds × rollouts per step; float64 unless said; within 20% of the peak resident size
    measured on cells of 256 seeds × 1024 rollouts, and above it where the network is wide):

    * all along: S networks of n parameters, float32: the weights, their gradients, AdamW's two
      moments, the KL reference, the final snapshot and the first iteration's gradients (float64):
      32·S·n bytes;
    * sampling: the states [S, B, T+1], log-probabilities and v* [S, B, T] as lists, stacked at the end
      (two copies), and during a step the network's activations (three [S, B, hidden] float32), the
      world's posterior ([S, B, components], three arrays) and the hashed noise (seven [S, B] arrays);
    * the update: those trajectories, the step advantages [S, B, T] (and two temporaries), the rewards
      and advantages [S, B, m] (two each), each seed's pair order (two copies) and the seven gathered
      arrays [S, B·K] (K the trained steps), and a micro-batch of S × min(micro_batch, UPDATE_ELEMENTS / S)
      pairs, about 48·hidden + 8·(4·features + 2) + 256 bytes each with their gradients;
    * an evaluation chunk of S × EVAL_ELEMENTS / S samples (activations, posterior, noise).

    Every cell of a plan has the same rollouts per step, so one cell's footprint is every cell's."""
    from recast_cli.train.stacked import EVAL_ELEMENTS, UPDATE_ELEMENTS

    cfg, policy = plan.cells[0].cfg, plan.setting.policy
    S, B, T, H, F = len(plan.seeds), cfg.group_size * cfg.prompts_per_step, policy.steps, policy.hidden, policy.features
    K, J, m = len(trained_steps(T, cfg.train_fraction)), len(world_of(plan.setting).weights), len(cfg.rewards)
    E = S * B
    params = 32 * S * (H * H + H * (4 * F + 5) + 1)
    trajectories = 8 * E * (3 * T + 1)
    sampling = max(2 * trajectories, trajectories + 12 * E * H + 24 * E * J + 56 * E)
    pairs = S * max(1, min(cfg.micro_batch, UPDATE_ELEMENTS // S))
    update = trajectories + 24 * E * T + 32 * E * m + 72 * E * K + pairs * (48 * H + 8 * (4 * F + 2) + 256)
    evaluation = S * max(1, EVAL_ELEMENTS // S) * (12 * H + 24 * J + 80)
    return {"seeds": S, "rollouts per step": B, "T": T, "hidden": H}, params + max(sampling, update, evaluation)


def prepare_weights(plan: StudyPlan, quiet: bool = False, force: bool = False) -> None:
    """The gain tables and every budget × arm W the cells need, each written once and kept when present
    and made of the same inputs (:func:`check_record`: refused, or with ``force`` recomputed, else)."""
    from recast_cli.estimate.config import EstimateConfig, GainOptions
    from recast_cli.estimate import stage as estimate_stage
    from recast_cli.solve.stage import solve_w

    study, setting = plan.study, plan.setting
    T = setting.policy.steps
    gains = gain_paths(plan)
    check_record(plan, force)
    opts = GainOptions(alphas=(study.alpha,))
    if "exact" in gains and not gains["exact"].is_file():
        gains["exact"].parent.mkdir(parents=True, exist_ok=True)
        exact_policy = "gmm1d" if setting.policy.world is None else str(setting.file)  # the setting's [world]
        cfg = EstimateConfig(policy=exact_policy, rewards=study.rewards, steps=study.estimate_steps)
        estimate_stage.exact_table(cfg, opts, gains["exact"])
    if "estimate" in gains and not gains["estimate"].is_file():
        gains["estimate"].parent.mkdir(parents=True, exist_ok=True)
        cfg = EstimateConfig(policy=str(setting.file), rewards=study.rewards, steps=study.estimate_steps,
                             N=study.n, K=study.k, P=study.p, sampling=study.sampling)
        estimate_stage.estimate(cfg, opts, gains["estimate"], quiet=quiet)
    if "conflicts" in gains and not gains["conflicts"].is_file():  # E14 needs rollouts every reward shares
        gains["conflicts"].parent.mkdir(parents=True, exist_ok=True)
        cfg = EstimateConfig(policy=str(setting.file), rewards=study.rewards, steps=study.estimate_steps,
                             N=study.n, K=study.k, P=study.p, sampling="pold")
        estimate_stage.estimate(cfg, opts, gains["conflicts"], quiet=quiet)
    skip = skip_clean_of(T, plan.cells[0].cfg.train_fraction)
    for cell in plan.cells:
        if cell.weights.is_file():  # one W per budget × arm: the cells of every G and rate share it
            continue
        cell.weights.parent.mkdir(parents=True, exist_ok=True)
        lam = ",".join(f"{x:g}" for x in cell.budget)
        if cell.arm.mode == "static":
            from recast_cli.artifacts import write_weights
            from recast_cli.solve.stage import static_matrix

            w = static_matrix(study.rewards, cell.budget, World1D.grid.sigmas(T)[::-1].copy(), skip,
                              info={"built_by": "recast study"})
            write_weights(cell.weights, w, config={"command": "recast study", "mode": "static"},
                          sources=[setting.file])
        else:
            variant = cell.arm.variant
            solve_w(gains[cell.arm.gains], lam, cell.weights, mode=cell.arm.mode, tau=study.tau, steps=T,
                    skip_clean=skip, kernel=cell.arm.kernel, shrink="auto" if variant == "shrinkauto" else cell.arm.shrink,
                    conflicts="static" if variant == "conflict" else "keep",
                    conflicts_from=gains.get("conflicts") if variant == "conflict" else None)


def gain_paths(plan: StudyPlan) -> dict[str, Path]:
    """The gain tables the plan's arms solve W from: ``exact`` and/or ``estimate`` → OUT/gains/NAME.parquet, and
    ``conflicts`` (a π^old-sampling estimate at the same budget, whose rollouts every reward shares: E14) for a
    conflict-aware arm."""
    needed = {c.arm.gains for c in plan.cells if c.arm.mode != "static"}
    if any(c.arm.variant == "conflict" for c in plan.cells):
        needed.add("conflicts")
    return {name: plan.out / "gains" / f"{name}.parquet" for name in ("exact", "estimate", "conflicts")
            if name in needed}


# --------------------------------------------------------------------------- what made each file


def gain_inputs(plan: StudyPlan, which: str) -> dict[str, str]:
    """Label → digest of each input of the ``exact`` or ``estimate`` gain table: the exact table is the
    world's (and the estimate's options), the sampled estimate also the base policy's."""
    made = policy_inputs(plan.setting)
    inputs = {"format": str(CELL_FORMAT), "[world]": made["[world]"]}
    if which != "exact":
        inputs["[policy]"] = made["[policy]"]
    keys = EXACT_KEYS if which == "exact" else ESTIMATE_KEYS
    options = {k: getattr(plan.study, k) for k in keys}
    if which == "conflicts":
        options["sampling"] = "pold"
    inputs["[study] gains options"] = digest(options)
    return inputs


def weights_inputs(plan: StudyPlan, cell: CellPlan) -> dict[str, str]:
    """Label → digest of each input of a cell's W: its gain table's (none for a static W), the arm, λ
    and τ, and the training grid it lives on (T and the clean steps skipped)."""
    static = cell.arm.mode == "static"
    inputs = {"format": str(CELL_FORMAT)} if static else gain_inputs(plan, cell.arm.gains)
    if cell.arm.variant == "conflict":
        inputs.update({f"conflicts {k}": v for k, v in gain_inputs(plan, "conflicts").items() if k != "format"})
    T = plan.setting.policy.steps
    arm = [cell.arm.mode, cell.arm.kernel, cell.arm.gains, cell.arm.shrink] + ([cell.arm.variant] if cell.arm.variant
                                                                               else [])
    inputs["[study] W options"] = digest({
        "arm": arm, "lambda": cell.budget,
        "rewards": plan.study.rewards,
        "tau": None if static else plan.study.tau, "T": T, "skip": skip_clean_of(T, plan.cells[0].cfg.train_fraction)})
    return inputs


def cell_inputs(plan: StudyPlan, cell: CellPlan, w) -> dict[str, str]:
    """Label → digest of everything that determines a cell: its W's inputs and the W itself, the
    world, the policy, the recipe (the cell's ``[train]`` with ``--set``; its prompts file by content), the
    evaluation, the seeds."""
    from recast_cli.train.plan import weights_key

    recipe = {**{k: v for k, v in asdict(cell.cfg).items() if k not in STALL_KEYS},  # the detector only watches
              "prompts": file_digest(cell.cfg.prompts)}
    return {**weights_inputs(plan, cell), **policy_inputs(plan.setting), "[train]": digest(recipe),
            "[evaluate] n": digest(plan.eval_n), "[evaluate] seed": digest(plan.eval_seed),
            "seed list": digest(plan.seeds), "W": weights_key(w)}


def changed_inputs(made: object, now: dict[str, str]) -> str | None:
    """None when ``made`` (a file's recorded inputs) equals ``now``; else what differs, in words."""
    if made == now:
        return None
    if not isinstance(made, dict) or made.get("format") != now["format"]:
        return "by an older recast (no record of its inputs, or another cell format)"
    differ = [label for label in now if made.get(label) != now[label]] or ["record"]
    return "with another " + (differ[0] if len(differ) == 1 else f"{', '.join(differ[:-1])} and {differ[-1]}")


def stale(path: Path, why: str, what: str = "was made") -> BadInput:
    """The one line for a file of OUT made of other inputs."""
    return BadInput(f"{path} {what} {why}; rerun with a fresh --out or --force")


def record_entries(plan: StudyPlan) -> dict[str, tuple[dict[str, str], tuple[tuple[Path, str], ...]]]:
    """OUT-relative name → (its inputs, its files with their schemas) for every gain table and W."""
    from recast_cli.estimate.stage import scores_path

    entries = {}
    for which, path in gain_paths(plan).items():
        files = ((path, GAINS_SCHEMA),) + (((scores_path(path), SCORES_SCHEMA),) if which != "exact" else ())
        entries[path.relative_to(plan.out).as_posix()] = (gain_inputs(plan, which), files)
    for cell in plan.cells:
        entries[cell.weights.relative_to(plan.out).as_posix()] = (weights_inputs(plan, cell),
                                                                   ((cell.weights, WEIGHTS_SCHEMA),))
    return entries


def check_record(plan: StudyPlan, force: bool) -> None:
    """Compare each gain table and W of OUT (its file, or an estimate's parts) with the inputs recorded in
    OUT/study.json: another one is refused (:func:`stale`), or with ``force`` removed (recast's own
    files only: a file of another kind is refused). Then record this plan's inputs, before any is
    computed, so that whatever is left of a killed computation is known to be of them."""
    from recast_cli.estimate.stage import PIECES

    path = plan.out / RECORD_NAME
    record = read_record(path)
    for name, (inputs, files) in record_entries(plan).items():
        parts = parts_dir(files[0][0])
        pieces = sorted(p.name for p in parts.glob(PIECES)) if parts.is_dir() else []
        why = changed_inputs(record.get(name), inputs)
        if why is not None and (pieces or any(f.exists() or f.is_symlink() for f, _ in files)):
            if not force:
                raise stale(files[0][0], why)
            for file, schema in files:  # every file checked before any is removed
                refuse_foreign_file(file, schema)
            for file, _ in files:
                file.unlink(missing_ok=True)
            finish_parts(files[0][0], pieces)
        record[name] = inputs
    atomic_write_bytes(path, json.dumps({"schema": RECORD_SCHEMA, "files": record}, sort_keys=True,
                                        indent=1).encode())


def read_record(path: Path) -> dict[str, object]:
    """The inputs OUT/study.json records per file ({} when there is none); BadInput for a file there that
    is not recast's record."""
    refuse_foreign_file(path, RECORD_SCHEMA)  # a link, a folder or a user's file is never read or replaced
    if not path.exists():
        return {}
    try:
        files = json_loads(path.read_bytes(), str(path)).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    if not isinstance(files, dict):
        raise BadInput(f"{path} is a damaged study record; rerun with a fresh --out")
    return files


def run_cell(plan: StudyPlan, cell: CellPlan, progress=None) -> CellTable:
    """Train and evaluate every seed of one cell; write its ``recast.cell/1`` file atomically."""
    import torch

    from recast_cli.train.stacked import BatchedTrainer, Cell
    from recast_cli.train.plan import check_weights, run_noise_level

    setting, T = plan.setting, plan.setting.policy.steps
    sigmas_desc = World1D.grid.sigmas(T)[::-1].copy()
    steps = trained_steps(T, cell.cfg.train_fraction)
    w = read_weights(cell.weights)
    check_weights(w, cell.cfg, sigmas_desc, None, str(cell.weights), steps)
    engine_cell = Cell(cfg=cell.cfg, W=w.W, trained_steps=tuple(steps), noise_level=run_noise_level(cell.cfg,
                       setting.policy), T=T, seeds=plan.seeds, features=setting.policy.features,
                       hidden=setting.policy.hidden, eval_n=plan.eval_n, eval_seed=plan.eval_seed)
    world = setting.policy.world
    if world is not None:  # a [world] of the setting's own: its mixture's v*, its step-function rewards
        engine_cell = replace(engine_cell, world=world)
    start = time.perf_counter()
    trainer = BatchedTrainer(engine_cell)
    result = trainer.run(progress)
    wall = time.perf_counter() - start
    table = cell_table(plan, cell, w, result, engine_cell, wall, torch.get_num_threads())
    write_cell(cell.path, table, config={"command": "recast study", "cell": cell.name},
               sources=[setting.file, cell.weights])
    return table


def cell_table(plan: StudyPlan, cell: CellPlan, w, result, engine_cell, wall: float, threads: int) -> CellTable:
    """The engine's per-seed rows as a :class:`CellTable` with everything the cell was in its metadata."""
    from recast_cli.train.plan import weights_key

    seeds, rewards, world = plan.seeds, tuple(cell.cfg.rewards), engine_cell.world
    scorers = (*rewards, "aggregate")
    points = tuple(dict.fromkeys((r["step"], r["sampler"]) for r in result.evals))
    at = {(r["seed"], r["step"], r["sampler"]): r for r in result.evals}
    evals = np.array([[[at[(s, st, k)][n] for n in scorers] for st, k in points] for s in seeds])
    eval_std = np.array([[[at[(s, st, k)][f"{n}_std"] for n in scorers] for st, k in points] for s in seeds])
    steps = tuple(range(1, cell.cfg.max_steps + 1))
    rows = {(r["seed"], r["step"]): r for r in result.train}
    quantities = (*TRAIN_QUANTITIES, *(f"{q}/{n}" for q in ("reward", "reward_spread") for n in rewards))
    train = {q: np.array([[rows[(s, st)][q] for st in steps] for s in seeds]) for q in quantities}
    g = result.first_gradients
    mean_g = g.mean(axis=0)
    spread = float(((g - mean_g) ** 2).sum(axis=1).mean()) if len(seeds) > 1 else None  # one seed: no spread
    signal = float((mean_g**2).sum())
    meta = {
        "setting": {"path": str(plan.setting.file), "name": plan.setting.name},
        "arm": cell.arm.label, "mode": cell.arm.mode, "kernel": cell.arm.kernel, "gains": cell.arm.gains,
        "lambda": list(cell.budget), "rewards": list(rewards), "group_size": cell.group_size,
        "prompts_per_step": cell.cfg.prompts_per_step, "n": plan.eval_n, "eval_seed": plan.eval_seed,
        "noise_level": engine_cell.noise_level, "W": np.asarray(w.W).tolist(), "weights_key": weights_key(w),
        "weights": str(cell.weights), "train": _jsonable(asdict(cell.cfg)),
        "gradient": {"iteration": 1, "mean_sq_norm": signal, "spread": spread,
                     "snr": signal / spread if spread and spread > 0 else None,
                     "what": "first iteration, before clipping: |E g|² and E|g − E g|² over the cell's seeds"},
        "reward_gradients": result.reward_gradients, "learning_rate": cell.cfg.learning_rate, "rung": cell.rung,
        "base": result.base, "reward_range": {r: list(world.reward_range(r)) for r in rewards},
        "engine": {"seeds": len(seeds), "wall_s": wall, "torch_threads": threads},
        MADE_FROM: cell_inputs(plan, cell, w),
    }
    return CellTable(seeds, rewards, points, evals, eval_std, steps, train, meta=meta)


def _jsonable(value):
    return json.loads(json.dumps(value, default=list))


def run_study(plan: StudyPlan, quiet: bool = False, shard: tuple[int, int] = (0, 1), force: bool = False) -> list[Path]:
    """Every cell of this shard not yet done (cell k belongs to shard k mod n), with a progress bar over
    cells (and the iterations of the one in flight). ``force``: files of OUT made of other inputs are
    recomputed, not refused. Returns every cell's path, done or not."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    mine = [c for k, c in enumerate(plan.cells) if k % shard[1] == shard[0]]
    for cell in mine:
        claim_output(cell.path, CELL_SCHEMA)
    (plan.out / "cells").mkdir(parents=True, exist_ok=True)
    with _shared(plan.out / ".prepare.lock"):  # the shards' gains and W: the first writes them, the rest wait
        prepare_weights(plan, quiet=quiet, force=force)
    todo = [c for c in mine if not _done(c, plan, force)]
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), disable=quiet) as bar:
        cells = bar.add_task("cells", total=len(mine), completed=len(mine) - len(todo))
        for cell in todo:
            inner = bar.add_task(f"  {cell.name}", total=cell.cfg.max_steps)
            run_cell(plan, cell, progress=lambda it, inner=inner: bar.update(inner, completed=it))
            bar.remove_task(inner)
            bar.advance(cells)
    return [c.path for c in plan.cells]


@contextlib.contextmanager
def _shared(path: Path):
    """An exclusive flock on ``path`` held for the block; a second process waits for it (not refused). The
    lock is a regular file of recast's own (a link, FIFO or folder there is refused)."""
    import fcntl

    from recast_cli.artifacts.regular import open_append

    path.parent.mkdir(parents=True, exist_ok=True)
    with open_append(path, "the lock file", text=True) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _done(cell: CellPlan, plan: StudyPlan, force: bool = False) -> bool:
    """A cell file that exists is done when it was made of exactly this plan's inputs (:func:`cell_inputs`);
    another one is refused, or with ``force`` run again (its file replaced when the cell is done)."""
    why = _staleness(cell, plan)
    if why is None:
        return cell.path.is_file()
    if force:
        return False
    raise stale(cell.path, why, "holds a cell of another study: it was made")


def _staleness(cell: CellPlan, plan: StudyPlan) -> str | None:
    """What makes the cell file there not this plan's (:func:`changed_inputs`); None when it is, or absent."""
    if not cell.path.is_file():
        return None
    table = read_cell(cell.path)
    if not cell.weights.is_file():  # another shard is remaking it (--force): this cell is of the old one
        return "with a W that is being remade"
    return changed_inputs(table.meta.get(MADE_FROM), cell_inputs(plan, cell, read_weights(cell.weights)))


def pending_cells(plan: StudyPlan) -> list[Path]:
    """The cells of the plan not yet done as this plan makes them (absent, or made of other inputs: another
    shard's, still to be remade): the report waits for them."""
    return [c.path for c in plan.cells if not c.path.is_file() or _staleness(c, plan) is not None]

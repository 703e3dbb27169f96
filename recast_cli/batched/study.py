"""``recast study SETTING``: a flow1d setting's whole ``[study]`` on the batched engine, cell by cell.

    exact gains (and the sampled estimate at the base policy, when an arm or the report needs it)
      →  solve-w for every budget × arm          (OUT/gains/, OUT/W/: the artifacts of the stages)
      →  every budget × arm × group size: one cell of all the study's seeds, trained and evaluated
         as one batched computation (``batched.engine``)  →  OUT/cells/NAME.parquet (recast.cell/1)
      →  ``recast report OUT/cells`` (the endpoints, the contrasts and the mechanism per arm)

A cell file is written atomically when the cell is done, and a cell whose file exists is not run
again: a study killed at any moment resumes where it stopped, losing at most the cell in flight.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from recast_cli.artifacts import CELL_SCHEMA, CellTable, claim_output, read_cell, read_weights, write_cell
from recast_cli.artifacts.cells import TRAIN_QUANTITIES
from recast_cli.errors import BadInput
from recast_cli.settings import Setting, load_setting
from recast_cli.study import ArmSpec, StudySpec, load_study
from recast_cli.train.config import TrainConfig, config_from_setting, skip_clean_of, trained_steps


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
    rollouts = base.group_size * base.prompts_per_step
    sizes = study.group_sizes or (base.group_size,)
    for g in sizes:
        if rollouts % g:
            raise BadInput(f"{setting.file.name}: [study] group_sizes: G = {g} does not divide the "
                           f"{rollouts} rollouts per step ([train] group_size × prompts_per_step)")
    arms = study.arm_specs()
    rates = dict(study.learning_rates)
    unknown = sorted(set(rates) - {a.label for a in arms} - {f"{a.label}@{g}" for a in arms for g in sizes})
    if unknown:
        raise BadInput(f"{setting.file.name}: [study] learning_rates names no arm: {', '.join(unknown)} "
                       f"(arms: {', '.join(a.label for a in arms)})")
    evaluation, _ = eval_config(setting)
    out = Path(out)
    cells = []
    for budget in study.budgets:
        label = study.label(budget)
        for arm in arms:
            for g in sizes:
                rate = rates.get(f"{arm.label}@{g}", rates.get(arm.label, base.learning_rate))
                name = f"{label}-{arm.label}-g{g}"
                cells.append(CellPlan(name, out / "cells" / f"{name}.parquet", arm, budget, g,
                                      out / "W" / f"{label}-{arm.label}.safetensors",
                                      replace(base, lam=budget, learning_rate=rate, group_size=g,
                                              prompts_per_step=rollouts // g)))
    return StudyPlan(setting, study, out, tuple(cells), tuple(seeds or study.seeds),
                     study.eval_n or evaluation.n, evaluation.seed)


def prepare_weights(plan: StudyPlan, quiet: bool = False) -> None:
    """The gain tables and every budget × arm W the cells need (each written once; kept when present)."""
    from recast_cli.estimate.config import EstimateConfig, GainOptions
    from recast_cli.estimate import stage as estimate_stage
    from recast_cli.solve.stage import solve_w

    study, setting = plan.study, plan.setting
    T = setting.policy.steps
    gains = {"exact": plan.out / "gains" / "exact.parquet", "estimate": plan.out / "gains" / "estimate.parquet"}
    needed = {c.arm.gains for c in plan.cells if c.arm.mode != "static"}
    opts = GainOptions(alphas=(study.alpha,))
    if "exact" in needed and not gains["exact"].is_file():
        gains["exact"].parent.mkdir(parents=True, exist_ok=True)
        exact_policy = "gmm1d" if setting.policy.world is None else str(setting.file)  # the setting's [world]
        cfg = EstimateConfig(policy=exact_policy, rewards=study.rewards, steps=study.estimate_steps)
        estimate_stage.exact_table(cfg, opts, gains["exact"])
    if "estimate" in needed and not gains["estimate"].is_file():
        gains["estimate"].parent.mkdir(parents=True, exist_ok=True)
        cfg = EstimateConfig(policy=str(setting.file), rewards=study.rewards, steps=study.estimate_steps,
                             N=study.n, K=study.k, P=study.p, sampling=study.sampling)
        estimate_stage.estimate(cfg, opts, gains["estimate"], quiet=quiet)
    skip = skip_clean_of(T, plan.cells[0].cfg.train_fraction)
    for cell in plan.cells:
        if cell.weights.is_file():
            continue
        cell.weights.parent.mkdir(parents=True, exist_ok=True)
        lam = ",".join(f"{x:g}" for x in cell.budget)
        if cell.arm.mode == "static":
            from recast_cli.artifacts import write_weights
            from recast_cli.grid import GridSpec
            from recast_cli.solve.stage import static_matrix

            w = static_matrix(study.rewards, cell.budget, GridSpec("linear").sigmas(T)[::-1].copy(), skip,
                              info={"built_by": "recast study"})
            write_weights(cell.weights, w, config={"command": "recast study", "mode": "static"},
                          sources=[setting.file])
        else:
            solve_w(gains[cell.arm.gains], lam, cell.weights, mode=cell.arm.mode, tau=study.tau, steps=T,
                    skip_clean=skip, kernel=cell.arm.kernel)


def run_cell(plan: StudyPlan, cell: CellPlan, progress=None) -> CellTable:
    """Train and evaluate every seed of one cell; write its ``recast.cell/1`` file atomically."""
    import torch

    from recast_cli.batched.engine import BatchedTrainer, Cell
    from recast_cli.train.plan import check_weights, run_noise_level

    setting, T = plan.setting, plan.setting.policy.steps
    from recast_cli.grid import GridSpec

    sigmas_desc = GridSpec("linear").sigmas(T)[::-1].copy()
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

    seeds, rewards = plan.seeds, tuple(cell.cfg.rewards)
    scorers = (*rewards, "aggregate")
    points = tuple(dict.fromkeys((r["step"], r["sampler"]) for r in result.evals))
    at = {(r["seed"], r["step"], r["sampler"]): r for r in result.evals}
    evals = np.array([[[at[(s, st, k)][n] for n in scorers] for st, k in points] for s in seeds])
    eval_std = np.array([[[at[(s, st, k)][f"{n}_std"] for n in scorers] for st, k in points] for s in seeds])
    steps = tuple(range(1, cell.cfg.max_steps + 1))
    rows = {(r["seed"], r["step"]): r for r in result.train}
    quantities = (*TRAIN_QUANTITIES, *(f"reward/{n}" for n in rewards))
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
        "engine": {"seeds": len(seeds), "wall_s": wall, "torch_threads": threads},
    }
    return CellTable(seeds, rewards, points, evals, eval_std, steps, train, meta=meta)


def _jsonable(value):
    return json.loads(json.dumps(value, default=list))


def run_study(plan: StudyPlan, quiet: bool = False, shard: tuple[int, int] = (0, 1)) -> list[Path]:
    """Every cell of this shard not yet done (cell k belongs to shard k mod n), with a progress bar over
    cells (and the iterations of the one in flight). Returns every cell's path, done or not."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    mine = [c for k, c in enumerate(plan.cells) if k % shard[1] == shard[0]]
    for cell in mine:
        claim_output(cell.path, CELL_SCHEMA)
    (plan.out / "cells").mkdir(parents=True, exist_ok=True)
    with _shared(plan.out / ".prepare.lock"):  # the shards' gains and W: the first writes them, the rest wait
        prepare_weights(plan, quiet=quiet)
    todo = [c for c in mine if not _done(c, plan)]
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
    """An exclusive flock on ``path`` held for the block; a second process waits for it (not refused)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _done(cell: CellPlan, plan: StudyPlan) -> bool:
    """A cell file that exists is done when it holds this plan's seeds, W and recipe; another one is refused."""
    if not cell.path.is_file():
        return False
    table = read_cell(cell.path)
    w = read_weights(cell.weights)
    from recast_cli.train.plan import weights_key

    same = (tuple(table.seeds) == plan.seeds and table.meta["weights_key"] == weights_key(w)
            and table.meta["train"] == _jsonable(asdict(cell.cfg)) and table.meta["n"] == plan.eval_n)
    if not same:
        raise BadInput(f"{cell.path} holds a cell of another study (seeds, W, recipe or n differ); "
                       "choose another --out or remove it")
    return True

"""``recast evaluate`` in the 1-D world (flow1d): mean rewards along a run, as a ``recast.curve/1`` table.

Samples are scalars, so an evaluation keeps, per evaluated (checkpoint, sampler), the mean
and std of every training reward and of the aggregate Σ_i λ_i·r_i over n samples, not one row
per sample. Top to bottom:

1. From the target (``evaluate/target``): the base policy of a setting (step 0), or a run and the checkpoints
   asked for (``--checkpoints all``, a list of steps, or the latest); the ``[evaluate]`` n,
   seed and batch size; the samplers (``sde``: the training sampler with the setting's noise
   level a, ``ode``: a = 0).
2. For every checkpoint and sampler: load the network, draw n trajectories from the seeds
   ``seed + k`` (the same seeds for every checkpoint and every run: common random numbers
   across arms and steps), score x_0, reduce.
3. Write the table atomically. One point takes about a second for n = 2^15 on a CPU core, so
   a killed evaluation is simply run again (nothing partial is kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from recast_cli.artifacts import CURVE_SAMPLERS, CURVE_SCHEMA, CurveTable, Source, claim_output, write_curve
from recast_cli.artifacts.run import SETTING_CHANGES
from recast_cli.errors import BadInput
from recast_cli.evaluate.config import EvalConfig, config_from_setting
from recast_cli.evaluate.target import Target


@dataclass(frozen=True)
class CurvePlan:
    target: Target
    cfg: EvalConfig
    steps: tuple[int, ...]  # 0 for the base policy
    samplers: tuple[str, ...]
    rewards: tuple[str, ...]
    lam: tuple[float, ...]
    out: Path


def parse_samplers(text: str | None) -> tuple[str, ...]:
    """``--sampler sde,ode`` → ("sde", "ode"); default the deterministic ODE, as for images."""
    names = tuple(dict.fromkeys(s.strip() for s in (text or "ode").split(",") if s.strip()))
    bad = [s for s in names if s not in CURVE_SAMPLERS]
    if not names or bad:
        raise BadInput(f"--sampler must be {' or '.join(CURVE_SAMPLERS)} (or both, comma-separated), got {text!r}")
    return names


def plan_curve(target: Target, out: Path, checkpoints: str | None, samplers: str | None, n: int | None = None,
               seed: int | None = None, batch_size: int | None = None) -> CurvePlan:
    """Check a flow1d evaluation of the resolved ``target``; BadInput for anything the user can fix (nothing
    is written)."""
    from recast_cli.artifacts.run import list_checkpoints, run_checkpoint

    if target.setting.policy.kind != "flow1d":
        raise BadInput(f"setting {target.setting.name!r} is not a flow1d setting")
    cfg, train = config_from_setting(target.setting)
    for key, value in (("n", n), ("seed", seed), ("batch_size", batch_size)):
        if value is not None:
            if value < (0 if key == "seed" else 1):
                raise BadInput(f"--{key.replace('_', '-')} must be >= {0 if key == 'seed' else 1}, got {value}")
            cfg = replace(cfg, **{key: value})
    if cfg.judges:
        raise BadInput(f"{target.setting.file}: the 1-D world has no judges (its [evaluate] judges must be empty)")
    if target.run is None:
        if checkpoints is not None:
            raise BadInput("--checkpoints selects checkpoints of --run; the base policy is step 0")
        steps: tuple[int, ...] = (0,)
        rewards, lam = tuple(train.rewards), tuple(float(x) for x in train.lam)
    else:
        found = sorted(dict(list_checkpoints(target.run)))
        if checkpoints in (None, "latest"):
            steps = (found[-1],)
        elif checkpoints == "all":
            steps = tuple(found)
        else:
            try:
                steps = tuple(int(s) for s in checkpoints.split(","))
            except ValueError:
                raise BadInput(f"--checkpoints {checkpoints!r}: expected all, latest or steps like 10,20") from None
            for step in steps:  # a step the run lacks: artifacts.run's one message for it
                run_checkpoint(target.run, f"--run {target.run}", step=step, record=False, verify=False)
        rewards = target.run_record.rewards
        lam = tuple(float(x) for x in target.run_record.lam)
    if not rewards or len(lam) != len(rewards):
        raise BadInput(f"{target.setting.file}: nothing to evaluate (rewards {list(rewards)}, lambda {list(lam)})")
    from recast_cli.setting.load import analytic_world

    for name in rewards:  # the world's rewards score the samples: a name it lacks is refused before any work
        analytic_world(target.setting.policy).check_reward(name)
    claim_output(out, CURVE_SCHEMA)
    return CurvePlan(target, cfg, steps, parse_samplers(samplers), rewards, lam, out)


def evaluate_curve(plan: CurvePlan, quiet: bool = False) -> CurveTable:
    """Steps 2-3: every (checkpoint, sampler) point, then the table, written atomically."""
    from recast_cli.policy.flow1d import load_network
    from recast_cli.setting.load import build_policy, build_reward
    from recast_cli.artifacts.run import step_dir

    spec = plan.target.setting.policy
    policy = build_policy(spec)
    scorers = [build_reward(spec, name) for name in plan.rewards]
    lam = np.asarray(plan.lam, dtype=np.float64)
    seeds = torch.arange(plan.cfg.n, dtype=torch.int64) + plan.cfg.seed
    points = [(step, sampler) for step in plan.steps for sampler in plan.samplers]
    means, stds, loaded = [], [], []
    columns = [TextColumn("evaluate"), BarColumn(), MofNCompleteColumn(), TextColumn("points"), TimeRemainingColumn()]
    from rich.console import Console

    with Progress(*columns, console=Console(stderr=True), disable=quiet) as progress:
        task = progress.add_task("evaluate", total=len(points))
        for step in plan.steps:
            if step > 0:
                path = load_network(policy, step_dir(plan.target.run, step))
                loaded.append({"step": step, "path": str(path), "sha256": Source.of(path).sha256})
            for sampler in plan.samplers:
                a = spec.noise_level if sampler == "sde" else 0.0
                scores = _scores(policy, scorers, seeds, a, plan.cfg.batch_size)
                values = np.concatenate([scores, scores @ lam[:, None]], axis=1)
                means.append(values.mean(axis=0))
                stds.append(values.std(axis=0))
                progress.advance(task)
    meta = _metadata(plan, loaded)
    table = CurveTable(points=tuple(points), scorers=(*plan.rewards, "aggregate"), n=plan.cfg.n,
                       mean=np.array(means), std=np.array(stds), meta=meta)
    sources = [Source.of(plan.target.setting.file)]
    if plan.target.run is not None:
        sources.append(Source.of(plan.target.run / "run.json"))
    config = {"evaluate": {"n": plan.cfg.n, "seed": plan.cfg.seed, "batch_size": plan.cfg.batch_size,
                           "steps": list(plan.steps), "samplers": list(plan.samplers)},
              SETTING_CHANGES: list(plan.target.setting_changes)}  # accepted with --allow-setting-change
    provenance = write_curve(plan.out, table, config=config, sources=sources)
    return replace(table, provenance=provenance)


@torch.no_grad()
def _scores(policy, scorers: Sequence, seeds: torch.Tensor, noise_level: float, batch: int) -> np.ndarray:
    """[n, m] rewards of x_0 drawn from ``seeds`` with the sampler of noise level a."""
    out = []
    for lo in range(0, len(seeds), batch):
        chunk = seeds[lo: lo + batch]
        x0 = policy.sample(policy.encode_prompts(["x"] * len(chunk)), noise_level, chunk,
                           keep_log_probs=False).states[:, -1]
        out.append(np.stack([np.asarray(s.score(x0, ["x"] * len(chunk)), dtype=np.float64) for s in scorers], axis=1))
    return np.concatenate(out)


def _metadata(plan: CurvePlan, loaded: list[dict[str, Any]]) -> dict[str, Any]:
    target = plan.target
    config = target.run_record.config if target.run_record is not None else {}
    spec = target.setting.policy
    return {
        "setting": {"path": str(target.setting.file), "name": target.setting.name},
        "mode": target.mode,
        "run": str(target.run) if target.run is not None else None,
        "train_seed": config.get("train", {}).get("seed") if target.run is not None else None,
        "init": config.get("init") if target.run is not None else None,
        "lambda": list(plan.lam),
        "rewards": list(plan.rewards),
        "weights_key": config.get("weights_key") if target.run is not None else None,
        "checkpoints": loaded,
        "sampling": {"steps": spec.steps, "n": plan.cfg.n, "seed": plan.cfg.seed, "seed_rule": "seed + k",
                     "noise_level": {"sde": spec.noise_level, "ode": 0.0}},
    }

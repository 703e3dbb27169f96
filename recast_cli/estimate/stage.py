"""The ``recast estimate`` stage, top to bottom (docs/method.md §4).

1. Resolve the policy (``gmm1d``, a setting, or a ``recast train`` run or checkpoint folder:
   the run's setting with the checkpoint's LoRA applied), the rewards and the positives (a
   ``recast.positives/1`` folder; exact π⁺ samples on gmm1d; the renderer in the toy world).
2. For every prompt of this shard not already done: rollouts and scores (``rollouts``),
   persisted per prompt in ``OUT.parts/`` so a killed run resumes where it stopped.
3. Write the ``recast.scores/1`` table, then one ``recast.gains/1`` table per α (``gains``).
``--from-scores`` starts at step 3 from a scores table: no rollout at all.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from safetensors.numpy import save as safetensors_bytes

from recast_cli.artifacts import (
    GAINS_SCHEMA,
    SCORES_SCHEMA,
    GainTable,
    ScoreTable,
    atomic_output,
    bad_piece,
    claim_output,
    finish_parts,
    json_loads,
    open_parts,
    parts_dir,
    read_array_piece,
    read_scores,
    write_gains,
    write_scores,
)
from recast_cli.artifacts.cells import MADE_FROM
from recast_cli.artifacts.parts import MARKER_NAME
from recast_cli.errors import BadInput
from recast_cli.estimate.gains import bootstrap_unit, estimate_gains
from recast_cli.estimate.rollouts import RolloutPlan, prompt_scores
from recast_cli.policy.world1d import World1D
from recast_cli.policy.world_limits import check_exact_work, check_tilt
from recast_cli.estimate.config import (EstimateConfig, GainOptions, check_bootstrap_cells, check_config,
                                        check_gain_options, check_score_cells, parse_shard)
from recast_cli.estimate.worlds import World, build_world, exact_world


#: The finished pieces of ``OUT.parts/``: one per prompt.
PIECES = "prompt-*.safetensors"


def output_paths(out: Path, alphas: Sequence[float]) -> list[Path]:
    """One gain table per α: OUT itself for a single α, OUT-alpha{α}.parquet for several."""
    if len(alphas) == 1:
        return [out]
    return [out.with_name(f"{out.stem}-alpha{a:g}{out.suffix}") for a in alphas]


def scores_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.scores.parquet")


@dataclass(frozen=True)
class Processes:
    """This process's place among the processes of an ``accelerate launch`` (or a lone process)."""

    rank: int = 0
    size: int = 1
    state: Any = None

    def wait(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()


def _stderr():
    from rich.console import Console

    return Console(stderr=True)


def processes() -> Processes:
    """Under ``accelerate launch`` (WORLD_SIZE > 1) every process takes its share of the prompts."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Processes()
    from accelerate import PartialState

    state = PartialState()
    return Processes(state.process_index, state.num_processes, state)


def run_rollouts(cfg: EstimateConfig, out: Path, shard: tuple[int, int] = (0, 1),
                 quiet: bool = False) -> ScoreTable | None:
    """Steps 1-2: rollouts and scores for this shard's prompts, resumable through OUT.parts/.

    Under ``accelerate launch`` the processes split the prompts, and the main process gathers
    every prompt once all are done (the others return None). Each finished prompt is a file in
    OUT.parts/, so gathering is reading them: the table equals a single process's.
    """
    procs = processes()
    if procs.size > 1 and shard != (0, 1):
        raise BadInput("--shard and accelerate launch would split the prompts twice; use one of them")
    world = build_world(cfg)
    wanted = [j for j in range(len(world.prompts)) if j % shard[1] == shard[0]]
    mine = [j for j in wanted if j % procs.size == procs.rank]
    check_score_cells(cfg, len(wanted))  # P is known once the world is (a prompts file, the positives)
    made_from = rollout_inputs(cfg, world)
    run_id = cfg.run_id(made_from)
    lock = None
    if procs.rank == 0:
        refuse_other_inputs(out, run_id, made_from)
        lock = open_parts(out, run_id, {"config": asdict(cfg), MADE_FROM: made_from}, pieces=PIECES,
                          writer="another recast estimate", what="run")
    try:
        procs.wait()
        parts = _PromptParts(parts_dir(out), world, (cfg.N, world.policy.T + 1, cfg.K, len(cfg.rewards)))
        for j in wanted:  # every finished part this run will read, before any rollout: a damaged one is named now
            if parts.done(j):
                parts.read(j)
        _roll_prompts(cfg, world, parts, mine, quiet=quiet or procs.rank > 0)
        procs.wait()
        if procs.rank > 0:
            return None
        return _gather(cfg, world, parts, wanted, out, run_id=run_id, shard=shard)
    except BaseException:
        if lock is not None and not any(parts_dir(out).glob(PIECES)):  # nothing to resume: no folder left over
            lock.release()
            finish_parts(out, ())
        raise
    finally:
        if lock is not None:
            lock.release()


@dataclass(frozen=True)
class _PromptParts:
    """OUT.parts/'s finished prompts: one file per prompt (named by its prompt id), scores of ``shape``."""

    folder: Path
    world: World
    shape: tuple[int, int, int, int]  # [N, T+1, K, m]

    def path(self, j: int) -> Path:
        return self.folder / f"prompt-{self.world.prompt_ids[j]:06d}.safetensors"

    def done(self, j: int) -> bool:
        return self.path(j).is_file()

    def read(self, j: int) -> np.ndarray:
        return _read_part(self.path(j), self.shape)

    def write(self, j: int, scores: np.ndarray) -> None:
        with atomic_output(self.path(j)) as tmp:
            # bytes first, then Python's write: a full disk is an OSError atomic_output names in one
            # line (safetensors' own writer raises its SafetensorError instead)
            tmp.write_bytes(safetensors_bytes({"scores": np.ascontiguousarray(scores)}))


def _roll_prompts(cfg: EstimateConfig, world: World, parts: _PromptParts, mine: Sequence[int], *,
                  quiet: bool) -> None:
    """Roll out and score every prompt of ``mine`` not finished yet, each written to its part once done,
    with a progress bar (and a line saying how many were already done) unless ``quiet``."""
    plan = RolloutPlan(K=cfg.K, rollout_noise=cfg.rollout_noise, crn=cfg.crn, seed=cfg.seed,
                       batch_size=cfg.batch_size)
    per_prompt = cfg.N * world.policy.T * cfg.K * world.positive_sets
    columns = [TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:.0f}/s"), TimeRemainingColumn()]
    done = sum(parts.done(j) for j in mine)
    if done and not quiet:
        _stderr().print(f"resuming: {done} of {len(mine)} prompts already done in {parts.folder}", highlight=False)
    with Progress(*columns, console=_stderr(), disable=quiet) as progress:
        task = progress.add_task("rollouts", total=per_prompt * len(mine), rate=0.0)
        for j in mine:
            if parts.done(j):
                progress.update(task, advance=per_prompt)
                continue
            scores = prompt_scores(world.policy, world.prompts[j], world.prompt_ids[j], world.scorers, plan,
                                   cfg.sampling, positives=world.positives(j) if world.positives else None,
                                   N=cfg.N, on_rollouts=lambda c: progress.update(task, advance=c))
            parts.write(j, scores)
            elapsed = progress.tasks[0].elapsed or 1e-9
            progress.update(task, rate=progress.tasks[0].completed / elapsed)


def _gather(cfg: EstimateConfig, world: World, parts: _PromptParts, wanted: Sequence[int], out: Path, *,
            run_id: str, shard: tuple[int, int]) -> ScoreTable:
    """Every wanted prompt's part into the ``recast.scores/1`` table, written beside OUT and read back;
    the parts folder is then finished (``finish_parts``)."""
    dense = np.stack([parts.read(j) for j in wanted]) if wanted else np.zeros((0, *parts.shape))
    meta = {
        "run_id": run_id, "rewards": list(cfg.rewards), "T": world.policy.T, "N": cfg.N, "K": cfg.K,
        "P": len(world.prompts), "sigmas": world.policy.sigmas.numpy().tolist(), "sampling": cfg.sampling,
        "crn": cfg.crn, "rollout_noise": cfg.rollout_noise,
        "guidance_scale": world.policy_info.get("guidance_scale"), "policy": world.policy_info,
        "positives": world.positives_info, "seed": cfg.seed, "shard": list(shard),
        "grid": world.policy.grid_spec.to_json(), "gmm1d": world.is_analytic,  # the policy's own σ grid
        "positive_sets": world.positive_sets,  # 1: every reward scored on the same rollouts (E14 can pair them)
    }
    table = ScoreTable(prompt_ids=tuple(world.prompt_ids[j] for j in wanted),
                       prompts=tuple(world.prompts[j] for j in wanted),
                       rewards=tuple(cfg.rewards), scores=dense, meta=meta)
    write_scores(scores_path(out), table, config=asdict(cfg), sources=world.sources)
    finish_parts(out, [parts.path(j).name for j in wanted])
    return read_scores(scores_path(out))


def rollout_inputs(cfg: EstimateConfig, world: World) -> dict[str, str]:
    """Label → digest of what fixes the rollouts beyond the flags, which name settings and files by
    path: the setting's resolved ``[policy]`` and ``[world]`` (as ``recast study`` records them for its
    gain tables) and its ``[rewards.*]`` options, a model's weights, a checkpoint's network or LoRA (a
    run folder's latest changes as it trains), the positives' manifest, a ``--prompts`` file's prompts.
    The run id holds them (:meth:`EstimateConfig.run_id`): the parts of a run made of other inputs
    are never resumed. ``--policy gmm1d`` has none: the flags fix docs/method.md §4's world."""
    from recast_cli.setting.load import digest, load_setting, policy_inputs

    inputs: dict[str, str | None] = {}
    if "setting" in world.policy_info:  # the file the world was built from (a run's: its setting)
        setting = load_setting(world.policy_info["setting"])
        inputs = {**policy_inputs(setting), "[rewards]": digest(setting.raw.get("rewards"))}
    inputs.update({"model weights": world.policy_info.get("weights_sha256"),
                   "checkpoint": world.policy_info.get("adapter_sha256"),
                   "positives": world.positives_info.get("sha256"),
                   "prompts": digest(world.prompts) if cfg.prompts_file is not None else None})
    return {label: value for label, value in inputs.items() if value is not None}


def refuse_other_inputs(out: Path, run_id: str, made_from: dict[str, str]) -> None:
    """One line naming what changed when ``OUT.parts/`` holds finished prompts of a run with the same
    flags but other inputs (:func:`rollout_inputs`: a setting's ``[world]`` edited since, ...), or of an
    older recast's run, which recorded none. Any other run's parts are refused by ``open_parts``."""
    parts = parts_dir(out)
    marker = parts / MARKER_NAME
    if not (marker.is_file() and any(parts.glob(PIECES))):
        return
    try:
        record = json_loads(marker.read_bytes(), str(marker))
    except (OSError, ValueError):  # unreadable: not this run's, which open_parts says
        return
    if not isinstance(record, dict) or record.get("run_id") == run_id or not made_from:
        return
    made = record.get(MADE_FROM)
    fix = "remove that folder to start this run again, or choose another --out"
    if not isinstance(made, dict):
        raise BadInput(f"{parts} holds partial results of a run of an older recast, which recorded no "
                       f"{_labels(list(made_from))}; {fix}")
    changed = [label for label in {**made, **made_from} if made.get(label) != made_from.get(label)]
    if changed:
        raise BadInput(f"{parts} holds partial results of a run with another {_labels(changed)} "
                       f"(changed since it stopped); {fix}")


def _labels(labels: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def _read_part(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """One prompt's finished scores [N, T+1, K, m] from OUT.parts/, or BadInput naming the file (truncated,
    corrupt, of another shape, or with a non-finite score where every rollout has one)."""
    scores = read_array_piece(path, "scores", shape)
    if not (np.isfinite(scores[:, 1:]).all() and np.isfinite(scores[:, 0, 0]).all()):
        raise bad_piece(path, "it holds a non-finite score")
    return scores


def gains_from_scores(table: ScoreTable, opts: GainOptions, outs: Sequence[Path], source: Path) -> list[GainTable]:
    """Step 3: one gain table per α from a scores table (no rollouts)."""
    meta = table.meta
    gmm1d = bool(meta.get("gmm1d"))
    beta = opts.beta if opts.beta is not None else (World1D.beta if gmm1d else 1.0)
    standardise = opts.standardise if opts.standardise is not None else not gmm1d
    if table.scores.shape[0] == 0:
        raise BadInput(f"{source}: the scores table holds no prompt")
    if opts.jackknife and table.scores.shape[3] < 2:
        raise BadInput("--jackknife needs K >= 2")
    check_bootstrap_cells(opts.bootstrap, table.scores.shape[2] - 1, table.scores.shape[4])
    recorded, scale_source = _recorded_scale(table) if standardise else (None, "none (raw rewards)")
    written = []
    for alpha, out in zip(opts.alphas, outs):
        est = estimate_gains(table.scores, table.rewards, alpha=alpha, beta=beta, sampling=meta["sampling"],
                             paired=paired_rollouts(meta),
                             monotone=opts.monotone, standardise=standardise, bootstrap=opts.bootstrap,
                             seed=int(meta.get("seed", 0)), jackknife=opts.jackknife, scale=recorded,
                             bootstrap_over=opts.bootstrap_over)
        scale = est.reward_scale.mean(axis=0)
        gains = GainTable(
            rewards=table.rewards, sigmas=np.asarray(meta["sigmas"], dtype=np.float64), D=est.D,
            gain_raw=est.gain_raw, gain=est.gain, D_lo=est.D_lo, D_hi=est.D_hi, gain_lo=est.gain_lo,
            gain_hi=est.gain_hi, gain_draws=est.gain_draws,
            meta={
                "alpha": alpha, "beta": beta, "N": meta["N"], "K": meta["K"], "P": int(table.scores.shape[0]),
                "sampling": meta["sampling"], "crn": meta["crn"], "monotone": opts.monotone,
                "reward_std": {r: float(s) for r, s in zip(table.rewards, scale)} if standardise else
                {r: 1.0 for r in table.rewards},
                "reward_std_source": scale_source,
                "reward_std_per_prompt": {str(pid): dict(zip(table.rewards, map(float, row)))
                                          for pid, row in zip(table.prompt_ids, est.reward_scale)} if standardise
                else None,
                "standardise": standardise, "policy": meta["policy"], "positives": meta["positives"],
                "rollout_noise": meta["rollout_noise"], "guidance_scale": meta["guidance_scale"],
                "run_id": meta["run_id"], "grid": meta["grid"], "surrogate_check": est.surrogate,
                "jackknife": opts.jackknife, "bootstrap": opts.bootstrap,
                "bootstrap_over": bootstrap_unit(opts.bootstrap_over, int(table.scores.shape[0])),
                "advantage_corr": est.advantage_corr,
                **({"partial": meta["partial"]} if "partial" in meta else {}),  # recast merge --allow-partial
            },
        )
        write_gains(out, gains, config={"alpha": alpha, "beta": beta, "monotone": opts.monotone,
                                        "bootstrap": opts.bootstrap, "jackknife": opts.jackknife,
                                        "bootstrap_over": opts.bootstrap_over,
                                        "standardise": standardise}, sources=[source])
        written.append(gains)
    return written


def paired_rollouts(meta: dict) -> bool:
    """Whether every reward of a scores table was scored on the same rollouts (E14 pairs them): π^old-sampling
    always; π⁺-sampling when one positive set served every reward (``positive_sets`` = 1; a table from before
    it was recorded: not known, so not paired)."""
    return meta.get("sampling") == "pold" or meta.get("positive_sets") == 1


#: Where the standardising scale s_{p,i} of §2 came from, as recorded in a gain table.
SCALE_POLD = "pold rollouts from pure noise (t = T)"
SCALE_SIR = "recorded with the self positives (the std of their pi_old draws)"


def _recorded_scale(table: ScoreTable) -> tuple[np.ndarray | None, str]:
    """The scale [P, m] ``self`` positives were tilted with, else None: the π^old std at t = T.

    SIR tilts each prompt's π^old draws by exp(r̃/β) with r̃ standardised over those draws; the
    estimator must standardise by the same scale, or it measures another π⁺ than the positives
    sample. A zero std (a constant reward) becomes 1, as in ``reward_scale``.
    """
    recorded = (table.meta.get("positives") or {}).get("reward_std")
    if not recorded:
        return None, SCALE_POLD
    try:
        scale = np.array([[recorded[str(pid)][r] for r in table.rewards] for pid in table.prompt_ids],
                         dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        return None, SCALE_POLD
    if not np.all(np.isfinite(scale)):
        return None, SCALE_POLD
    return np.where(scale > 0, scale, 1.0), SCALE_SIR


def exact_table(cfg: EstimateConfig, opts: GainOptions, out: Path) -> list[GainTable]:
    """``--exact`` on an analytic world (``--policy gmm1d``, or a gmm1d/flow1d setting with its
    ``[world]``): the exact D curves in the gain-table schema, one table per α.

    Before any output is claimed or any quadrature runs: the gain options (``recast study`` calls this
    directly), every reward's spread against β (exp((r − r_min)/β) must not overflow) and the whole
    table's work (``world_limits.check_exact_work``: rewards × noise levels × α, each level's quadrature grid ×
    cells)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from recast_cli.policy.gmm1d import exact_gain_table

    check_gain_options(opts)
    world, where, sources = exact_world(cfg.policy)
    beta = opts.beta if opts.beta is not None else world.beta
    for reward in cfg.rewards:
        world.check_reward(reward)
        check_tilt(f"reward {reward!r} of {world.label}:", world.reward(reward), beta,
                   "scale the reward down or raise --beta")
    check_exact_work(world, cfg.rewards, world.grid.sigmas(cfg.steps), len(opts.alphas))
    paths = output_paths(out, opts.alphas)
    for path in paths:
        claim_output(path, GAINS_SCHEMA)
    tables = []
    columns = [TextColumn("exact D"), BarColumn(), MofNCompleteColumn(), TextColumn("levels"), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("exact", total=len(opts.alphas) * len(cfg.rewards) * (cfg.steps + 1))
        for alpha, path in zip(opts.alphas, paths):
            table = exact_gain_table(tuple(cfg.rewards), alpha=alpha, steps=cfg.steps, beta=beta,
                                     advance=lambda: progress.advance(task), world=world)
            write_gains(path, table, config={"world": "gmm1d", "exact": True, "alpha": alpha, **where},
                        sources=sources)
            tables.append(table)
    return tables


def estimate(cfg: EstimateConfig, opts: GainOptions, out: str | Path, shard: str | None = None,
             quiet: bool = False) -> list[Path]:
    """The whole stage; returns the paths written (scores table first, then the gain tables)."""
    check_config(cfg, opts)
    out = Path(out)
    shard_ix = parse_shard(shard)
    outs = output_paths(out, opts.alphas)
    positives = [cfg.positives and Path(cfg.positives) / "manifest.parquet"]
    claim_output(scores_path(out), SCORES_SCHEMA, inputs=positives)
    for path in outs:
        claim_output(path, GAINS_SCHEMA, inputs=positives)
    table = run_rollouts(cfg, out, shard_ix, quiet=quiet)
    if table is None:
        return []  # another process of an accelerate launch gathers and writes
    if shard_ix[1] > 1:
        return [scores_path(out)]  # a shard's gains come from `recast merge`
    gains_from_scores(table, opts, outs, scores_path(out))
    return [scores_path(out), *outs]


"""The run folder ``recast train`` writes (docs/artifacts: a run): started whole, locked while trained,
restarted in place, its checkpoints saved and resumed.

The trainer (``train.trainer``) owns one :class:`RunFolder` and calls it at exactly these points:
``open`` (rank 0, when the run is opened), ``save`` (every process, at each checkpoint), ``restore``
(every process, when a checkpoint is resumed) and ``close``. The folder holds ``weights.safetensors``
(the W trained with), ``config.toml``, ``run.json``, ``metrics.parquet`` (``train.metrics``) and the
checkpoints (``train.checkpoint``).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recast_cli.artifacts import FolderLock, RunRecord, atomic_write_bytes, write_run
from recast_cli.artifacts.cells import MADE_FROM
from recast_cli.artifacts.run import MADE_FROM_VALUES
from recast_cli.errors import BadInput
from recast_cli.train import checkpoint as ckpt
from recast_cli.train.plan import Plan, weights_key
from recast_cli.train.sharding import full_tensor, shard_like


class RunLock(FolderLock):
    """The run folder's lock, held while training: a second ``recast train`` on the same folder
    gets one line and exit 2 instead of mixing its checkpoints and metrics into the first one's."""

    def __init__(self, folder: Path):
        super().__init__(folder, "another recast train")


class RunFolder:
    """The run folder of ``plan`` as a trainer of ``T`` steps over ``processes`` processes (its
    ``engine``: single, ddp or fsdp) writes it. Built, it has written nothing; :meth:`open` takes
    the lock, :meth:`close` releases it (the one place each happens)."""

    def __init__(self, plan: Plan, *, T: int, processes: int, engine: str):
        self.plan = plan
        self.cfg = plan.cfg
        self.path = plan.run
        self.T = T
        self.processes = processes
        self.engine = engine
        self.lock: RunLock | None = None
        self.started: bool | None = None  # this open started the run: in a new folder (False), an empty one (True)

    def config_record(self) -> dict[str, Any]:
        """The run's configuration, as run.json and the loggers record it (a new dict each call)."""
        p = self.plan
        return {"setting": str(p.setting.file), "weights": p.weights_source, "mode": p.weights.mode,
                "weights_key": weights_key(p.weights), "train": {k: v for k, v in asdict(self.cfg).items()},
                "noise_level": p.noise_level, "T": self.T, "trained_steps": p.trained_steps,
                "init": str(p.init_from) if p.init_from else None, "processes": self.processes,
                "engine": self.engine}

    # ------------------------------------------------------------------ the folder and its lock

    def open(self) -> None:
        """Rank 0: the run folder, locked. A new one is started whole, then locked; an existing one is
        locked, then restarted in place unless a checkpoint of it is resumed."""
        existing = (self.path / "run.json").is_file()
        if not existing:
            empty = self.path.is_dir()
            self._start()
            self.started = empty
        self.lock = RunLock(self.path)  # the one place the lock is taken; close() releases it
        if existing and self.plan.resume_from is None:  # a run of this configuration that never saved a checkpoint
            self.clean_partial()
            self._write_start(self.path)

    def close(self) -> None:
        """Release the lock (if taken); nothing is written after this."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def discard(self) -> None:
        """After a failed open, the lock released: the run this open started goes (its folder, or what it put
        in the empty folder given), so that the same command run again starts it afresh rather than finding a
        run it would have to ``--resume``."""
        import shutil

        if self.started is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            if self.started:
                self.path.mkdir(exist_ok=True)
            self.started = None

    def _start(self) -> None:
        """Write weights.safetensors, config.toml and run.json. A new run folder appears whole: the
        files are written into a temporary sibling that is renamed into place (onto a missing or
        empty --out), so a folder either holds run.json or does not exist; a second process
        starting the same --out loses the rename and stops with one line."""
        import shutil

        run = self.path
        run.parent.mkdir(parents=True, exist_ok=True)
        staging = run.parent / f".{run.name}.starting-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            self._write_start(staging)
        except BaseException:  # a start that failed leaves nothing behind
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            os.rename(staging, run)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise BadInput(f"{run} was started by another process meanwhile; choose another --out") from None

    def _write_start(self, run: Path) -> None:
        from recast_cli.artifacts import write_weights

        plan, cfg = self.plan, self.cfg
        sources = [plan.setting.file] + ([plan.weights_source] if plan.weights_source != "static" else [])
        write_weights(run / "weights.safetensors", plan.weights,
                      config={"copied_from": plan.weights_source}, sources=sources)
        atomic_write_bytes(run / "config.toml", cfg.to_toml().encode())
        record = RunRecord(rewards=tuple(cfg.rewards), lam=tuple(cfg.lam), mode=plan.weights.mode,
                           sigmas=tuple(float(s) for s in plan.weights.sigmas))
        write_run(run, record, config={**self.config_record(), "run_key": cfg.run_key(), MADE_FROM: plan.made_from,
                                       MADE_FROM_VALUES: plan.made_from_values}, sources=sources)

    # ------------------------------------------------------------------ checkpoints

    def save(self, iteration: int, *, params, optimizer, ema: dict | None, rank: int) -> Path | None:
        """Write the checkpoint of training step ``iteration`` (rank 0): the adapter (and its EMA), the
        optimizer, the RNG and the state a resume checks. Every process gathers first: under FSDP each
        holds shards."""
        cfg, plan = self.cfg, self.plan
        adapter = params.state()
        ema = {n: full_tensor(v) for n, v in ema.items()} if ema is not None else None  # gathered once
        ema_state = params.state(ema) if ema is not None else None
        tensors, meta = ckpt.optimizer_tensors(optimizer, params.names)
        if ema is not None:
            tensors.update({f"ema/{n}": v for n, v in ema.items()})
        if rank != 0:
            return None
        tensors.update(ckpt.rng_tensors())
        state = {"schema": ckpt.CHECKPOINT_SCHEMA, "step": iteration, "run_key": cfg.run_key(),
                 MADE_FROM: plan.made_from,  # the policy and world trained: a resume checks them
                 "weights_key": weights_key(plan.weights), "weights": plan.weights_source,
                 "mode": plan.weights.mode, "data_position": iteration * cfg.prompts_per_step,
                 "lr_schedule": {"kind": cfg.lr_schedule, "warmup_steps": cfg.warmup_steps,
                                 "base_lr": cfg.learning_rate, "step": iteration},
                 "optimizer": meta, "seed": cfg.seed, "processes": self.processes, "engine": self.engine}

        def write_files(folder: Path) -> None:
            params.save(folder / "adapter", adapter)
            if ema_state is not None:
                params.save(folder / "adapter_ema", ema_state)

        return ckpt.save_checkpoint(self.path, iteration, write_files, tensors, state, cfg.keep_checkpoints)

    def restore(self, folder: Path, *, params, optimizer, ema: dict | None) -> tuple[int, dict | None]:
        """Continue from checkpoint ``folder``, whose adapter the trainer loaded into ``params`` before any
        wrap: the optimizer's state, the RNG; returns (its training step, the EMA restored, sharded like
        ``params``, or None without one)."""
        tensors, state = ckpt.read_checkpoint(folder)
        ckpt.load_optimizer(optimizer, tensors, state["optimizer"], params.names, str(folder))
        if ema is not None:
            live = dict(params.named)
            ema = {name: shard_like(tensors[f"ema/{name}"], live[name]).clone() for name in ema}
        ckpt.restore_rng(tensors)
        return int(state["step"]), ema

    def clean_partial(self) -> None:
        """Remove the temporary folder a checkpoint save killed mid-way left (rank 0)."""
        ckpt.clean_partial(self.path)

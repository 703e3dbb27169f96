"""The ``recast train`` stage: Flow-GRPO-style online RL with W frozen (docs/method.md §6).

One iteration (a "step" in the metrics and checkpoints):

1. **Sample** ``prompts_per_step`` groups of G images with the SDE sampler (noise level a),
   keeping every state x_T … x_0 and each step's log-probability (E1). Groups are whole
   within a process; noise comes from (run seed, step, global image index), so the images
   do not depend on how many processes share the work. Rewards are scored in a worker
   thread while the next chunk is sampled.
2. **Advantages**: per-reward group normalisation over the gathered rewards, then E13
   ``A_t = T'·Σ_i W_{i,t}·A_i`` over the T' trained steps (W is zero on the others), clipped
   to ±adv_clip.
3. **Update**: every (image, trained step) pair is one term of the loss, the PPO-clipped
   ratio times A_t plus β_KL times the exact Gaussian KL to the reference policy (adapter
   off). Pairs of different steps share one forward/backward (the model takes a per-sample
   timestep), gradients accumulate over micro-batches, then one AdamW step per
   ``updates_per_step`` chunk, with grad-norm clipping and an optional EMA.

Static, ReCAST and no-Sink runs differ only in the W file (``--weights``). The engine follows
the launch (``Trainer.engine``): one process, DDP through accelerate, or FSDP2 (``train/sharding``)
under an FSDP accelerate config; all three train the same thing at the same global batch.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.policy.families import FAMILIES
from recast_cli.setting.prompts import prompt_stream
from recast_cli.seeds import train_seeds, update_rng
from recast_cli.train.loggers import start_loggers
from recast_cli.train.metrics import MetricsLog, PlainProgress, step_metrics
from recast_cli.train.objective import PairLoss, group_advantages, pair_loss, step_advantages
from recast_cli.train.params import Parameters
from recast_cli.train.plan import Plan, check_fsdp
from recast_cli.train.runfolder import RunFolder
from recast_cli.train.sharding import clip_grad_norm, local_part, requested_fsdp, shard
from recast_cli.train.conflict import ConflictWatch
from recast_cli.train.stall import StallWatch


# ------------------------------------------------------------------ the trainer


@dataclass
class Batch:
    """This process's share of one iteration: whole groups, G images each, in group order."""

    prompts: list[str]
    cond: Any
    states: torch.Tensor  # [B, T+1, …]: states[:, j] is x_{T−j}
    log_probs: torch.Tensor  # [B, T]: log_probs[:, j] is step t = T − j
    rewards: torch.Tensor  # [B, m] float64


class Trainer:
    """The engine (policy, rewards, trained parameters, optimizer over one, DDP or FSDP processes) and,
    while open, the run it writes: ``with Trainer(plan) as trainer: trainer.train()``.

    Built, it has written nothing; opening takes the run folder's lock (rank 0), starts, restarts or
    resumes the run, and closing releases the lock: the trainer's ``folder`` (``train.runfolder``)
    owns it, taken and released in exactly those two places.
    ``iteration`` counts training iterations (a "step" of the metrics and checkpoints);
    ``trained_steps`` are the diffusion steps t the loss covers (the plan's).
    """

    # ------------------------------------------------------------------ set-up: the engine, then the run

    def __init__(self, plan: Plan, accelerator=None, quiet: bool = False, loggers: bool = True,
                 policy=None, scorers=None, lines: bool = False):
        """Build the engine of ``plan`` (:meth:`build_engine`); nothing is written until :meth:`open`.

        ``policy`` and ``scorers`` given are used as built (``recast preflight``: a random-weight
        pipeline and stand-in rewards); by default the setting's are built. ``loggers`` False: the
        run writes ``metrics.parquet`` alone, whatever ``[train] logger`` lists. ``lines``: one plain line
        per step, prefixed with the run, even on a terminal (several runs sharing one log)."""
        self.plan = plan
        self.cfg = plan.cfg
        self.quiet = quiet
        self.lines = lines
        self.use_loggers = loggers
        self.trained_steps = plan.trained_steps
        self.W = torch.as_tensor(plan.weights.W, dtype=torch.float64)
        self.lam = np.asarray(plan.cfg.lam, dtype=np.float64)
        self.iteration = 0
        self.run = plan.run
        self.metrics: MetricsLog | None = None
        self.is_open = False
        self.build_engine(accelerator, policy, scorers)
        self.folder = RunFolder(plan, T=self.T, processes=self.world, engine=self.engine)

    def build_engine(self, accelerator, policy, scorers) -> None:
        """The processes, the policy and rewards, the trained parameters (a resumed or ``--init`` adapter
        loaded before any wrap: FSDP shards the loaded tensors), the DDP wrap or FSDP2 shards, compile,
        the optimizer and the EMA."""
        from accelerate import Accelerator

        from recast_cli.policy.lora import trained_parameters
        from recast_cli.setting.load import build_policy, build_reward

        plan, cfg = self.plan, self.cfg
        fsdp_version = requested_fsdp()
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if fsdp_version is not None:  # before accelerate, which builds its FSDP1 plugin from the launch (GPU only)
            check_fsdp(cfg, fsdp_version, launched)
        self.acc = accelerator or Accelerator(cpu=plan.device == "cpu")
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        if launched > 1 and self.world == 1:  # each process would train alone and all would write one run folder
            raise BadInput(f"launched as {launched} processes, but accelerate runs this one alone (no GPU visible); "
                           "on CPUs pass --device cpu")
        if cfg.prompts_per_step % self.world:
            raise BadInput(f"prompts_per_step = {cfg.prompts_per_step} groups do not split over {self.world} processes")
        self.policy = policy if policy is not None else build_policy(
            plan.setting.policy, device=str(self.acc.device),
            trainable=lambda transformer: trained_parameters(transformer, cfg.lora_rank, cfg.lora_targets))
        self.T = self.policy.T
        self.scorers = scorers if scorers is not None else \
            [build_reward(plan.setting.policy, name, **cfg.reward_options.get(name, {})) for name in cfg.rewards]
        transformer = self.policy.network
        if cfg.gradient_checkpointing:  # diffusers' own: each block's activations recomputed in the backward
            if not getattr(transformer, "_supports_gradient_checkpointing", False):
                raise BadInput(f"gradient_checkpointing: {type(transformer).__name__} does not support it")
            transformer.enable_gradient_checkpointing()
        self.params = Parameters(transformer, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.seed,
                                 keep_reference=cfg.beta_kl > 0)
        adapter = plan.resume_from / "adapter" if plan.resume_from is not None else plan.init_from
        if adapter is not None:
            self.params.load(adapter)
        self.fsdp = fsdp_version is not None
        if self.fsdp:
            shard(transformer, self.acc.device, fsdp_blocks(plan.setting.policy.kind))
            self.params.bind_sharded()
        elif self.world > 1:
            self.policy.denoiser = self.acc.prepare(transformer)
        if cfg.compile:  # after the DDP wrap, as torch recommends; the parameters stay the same objects
            self.policy.denoiser = torch.compile(self.policy.denoiser, backend=cfg.compile_backend)
        self.optimizer = torch.optim.AdamW(self.params.tensors, lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay)
        self.ema = {n: p.detach().clone() for n, p in self.params.named} if cfg.ema_decay > 0 else None

    def __enter__(self) -> Trainer:
        self.open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def open(self) -> None:
        """Open the run: the folder, locked (rank 0: started, or restarted if it never saved a checkpoint),
        the metrics log with its stall watch (``train/stall``) and its loggers (rank 0; W sent to them), and
        the checkpoint a resumed run continues from (every process)."""
        try:
            if self.rank == 0:
                self.folder.open()
                loggers = start_loggers(self.cfg.logger, self.run, self.cfg.wandb_project,
                                        self.folder.config_record()) if self.use_loggers else None
                rule = self.cfg.stall_rule()
                conflict = (ConflictWatch(self.cfg.rewards, self.W.numpy(), self.trained_steps, self.plan.weights.info)
                            if len(self.cfg.rewards) > 1 else None)
                self.metrics = MetricsLog(self.run, self.folder.config_record(), loggers,
                                          stall=StallWatch(self.cfg.rewards, rule) if rule is not None else None,
                                          conflict=conflict)
            if self.plan.resume_from is not None:  # the adapter was loaded by build_engine
                self.iteration, self.ema = self.folder.restore(self.plan.resume_from, params=self.params,
                                                               optimizer=self.optimizer, ema=self.ema)
                if self.metrics is not None:
                    self.metrics.resume(self.iteration)
                    self.folder.clean_partial()
            if self.metrics is not None:
                self.metrics.log_weights(self.iteration, self.W.numpy(), self.cfg.rewards, len(self.trained_steps))
        except BaseException:
            self.close()
            self.folder.discard()  # a run folder this open started goes with it: a rerun starts afresh
            raise
        self.is_open = True
        self.acc.wait_for_everyone()

    def close(self) -> None:
        """Close the run: the metrics log, then the folder's lock; the trainer writes nothing after this."""
        self.is_open = False
        if self.metrics is not None:
            self.metrics.close()
        self.folder.close()

    @property
    def engine(self) -> str:
        """How the processes share the model: ``single``, ``ddp`` or ``fsdp``."""
        return "fsdp" if self.fsdp else ("ddp" if self.world > 1 else "single")

    # ------------------------------------------------------------------ the loop

    def train(self, max_steps: int | None = None) -> int:
        """Iterate to ``max_steps`` (the config's by default), saving every ``save_every`` steps, in the
        open run; returns the iterations done."""
        if not self.is_open:
            raise RuntimeError("the run is not open: with Trainer(plan) as trainer: trainer.train()")
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        goal = self.cfg.max_steps if max_steps is None else max_steps
        columns = [TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward {task.fields[agg]:.4f}  loss {task.fields[loss]:+.2e}  "
                              "kl {task.fields[kl]:.2e}  {task.fields[ips]:.1f} img/s"), TimeRemainingColumn()]
        from rich.console import Console
        from rich.markup import escape

        console = Console(stderr=True)
        # stderr not a terminal (a batch job's log): one plain line per step in place of the bar
        shown = not (self.quiet or self.rank > 0)
        plain = PlainProgress(goal, self.iteration) if shown and (self.lines or not console.is_terminal) else None
        prefix = f"{self.run.parent.name}/{self.run.name}: " if self.lines else ""
        with Progress(*columns, console=console, disable=self.quiet or self.rank > 0 or plain is not None) as progress:
            task = progress.add_task("train", total=goal, completed=min(self.iteration, goal), agg=math.nan,
                                     loss=0.0, kl=0.0, ips=0.0)
            if self.metrics is not None and self.metrics.conflict is not None and self.iteration == 0:
                for line in self.metrics.conflict.start():
                    progress.console.print(f"[yellow]recast: warning:[/] {escape(line)}", soft_wrap=True,
                                           highlight=False)
            while self.iteration < goal:
                row = self.train_step()
                s = row["scalars"]
                if self.metrics is not None:
                    for line in self.metrics.add(self.iteration, row["per_reward"], s, row["step_adv_abs"]):
                        progress.console.print(f"[yellow]recast: warning:[/] {escape(line)}", soft_wrap=True,
                                               highlight=False)
                    self.metrics.write()
                if self.iteration % self.cfg.save_every == 0 or self.iteration == goal:
                    self.save()
                    self.acc.wait_for_everyone()
                elapsed = s["sample_s"] + s["update_s"]
                progress.update(task, completed=self.iteration, agg=s["aggregate"], loss=s["loss"], kl=s["kl"],
                                ips=s["images"] / max(elapsed, 1e-9))
                if plain is not None:
                    sys.stderr.write(prefix + plain.line(self.iteration, row["per_reward"], s) + "\n")
                    sys.stderr.flush()
        return self.iteration

    def train_step(self) -> dict[str, Any]:
        """One iteration (training step ``iteration + 1``): sample, score, advantages, update; returns the
        metrics row material."""
        iteration = self.iteration
        lr = self.cfg.learning_rate_at(iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        batch = self.sample(iteration)
        all_rewards = self.gather_rewards(batch)
        adv, adv_t = self.advantages(all_rewards)
        t1 = time.perf_counter()
        stats = self.update(batch, adv_t, iteration)
        t2 = time.perf_counter()
        self.iteration = iteration + 1
        every = self.cfg.log_images_every
        if self.metrics is not None and every and self.iteration % every == 0:  # rank 0's own groups
            self.metrics.log_samples(self.iteration, self.policy.decode, batch.states[:, -1], batch.prompts,
                                     batch.rewards, self.cfg.rewards, self.cfg.group_size)
        return step_metrics(self.cfg, self.W, self.lam, len(self.trained_steps), all_rewards, adv, stats, lr,
                            sample_s=t1 - t0, update_s=t2 - t1)

    # ------------------------------------------------------------------ one iteration: sample → rewards → E13 → update

    @torch.no_grad()
    def sample(self, step: int) -> Batch:
        """Sample and score this process's groups of iteration ``step`` (rewards overlap sampling)."""
        cfg, G = self.cfg, self.cfg.group_size
        order = prompt_stream(len(self.plan.prompts), cfg.seed, step * cfg.prompts_per_step, cfg.prompts_per_step)
        groups = list(self.local_groups())
        prompts = [self.plan.prompts[int(order[g])] for g in groups for _ in range(G)]
        index = np.array([g * G + k for g in groups for k in range(G)], dtype=np.int64)
        seeds = torch.from_numpy(train_seeds(cfg.seed, step, index))
        for prompt in dict.fromkeys(prompts):  # one at a time: a batch's roundoff would depend on the process count
            self.policy.encode_prompts([prompt])
        cond = self.policy.encode_prompts(prompts)
        states, log_probs, futures = [], [], []
        finite = True
        with ThreadPoolExecutor(max_workers=1) as pool:
            for lo in range(0, len(prompts), cfg.sample_batch):
                idx = torch.arange(lo, min(lo + cfg.sample_batch, len(prompts)))
                traj = self.policy.sample(cond.take(idx), self.plan.noise_level, seeds[idx])
                states.append(traj.states)
                log_probs.append(traj.log_probs)
                images = self.policy.decode(traj.states[:, -1])
                finite = bool(torch.isfinite(images).all())
                if not finite:  # never scored: a reward would fail on it with a traceback
                    break
                futures.append(pool.submit(self._score, images, prompts[lo: lo + len(idx)]))
            self.stop_unless_finite(finite, step, "the sampled images")
            rewards = torch.cat([f.result() for f in futures])
        return Batch(prompts, cond, torch.cat(states), torch.cat(log_probs), rewards)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        cols = []
        for name, scorer in zip(self.cfg.rewards, self.scorers):
            values = np.asarray(scorer.score(images.cpu(), prompts), dtype=np.float64)
            if values.shape != (len(prompts),) or not np.all(np.isfinite(values)):
                raise RuntimeError(f"reward {name} returned {values.shape} values or non-finite scores")
            cols.append(torch.from_numpy(values))
        return torch.stack(cols, dim=1)

    def gather_rewards(self, batch: Batch) -> torch.Tensor:
        """Every process's rewards in global group order [P·G, m]."""
        if self.world == 1:
            return batch.rewards
        return self.acc.gather(batch.rewards.to(self.acc.device)).cpu()

    def advantages(self, all_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A_i over all images [P·G, m], A_t of this process's images [B, T]) — E13 with clipping."""
        adv = group_advantages(all_rewards, self.cfg.group_size, global_std=self.cfg.adv_std == "global")
        per = (self.cfg.prompts_per_step // self.world) * self.cfg.group_size
        local = adv[self.rank * per: (self.rank + 1) * per]
        return adv, step_advantages(local, self.W, clip=self.cfg.adv_clip, trained=len(self.trained_steps))

    def pair_loss(self, batch: Batch, adv_t: torch.Tensor, pairs: np.ndarray) -> tuple[torch.Tensor, dict[str, float]]:
        """Summed loss of (image, step) pairs, all steps in one batched forward; with its parts."""
        dev = self.policy.device
        b = torch.as_tensor(pairs[:, 0], dtype=torch.long)
        t = torch.as_tensor(pairs[:, 1], dtype=torch.long)
        j = self.T - t
        x = batch.states[b, j].to(dev)
        prev = batch.states[b, j + 1].to(dev)
        cond = batch.cond.take(b)
        out = self.policy.step(x, t, cond, self.plan.noise_level, prev_sample=prev)
        old = batch.log_probs[b, j].to(dev)
        A = adv_t[b, t - 1].to(dev, out.log_prob.dtype)
        ref_mean = dt = None
        if self.cfg.beta_kl > 0:  # the reference policy (adapter off)'s transition, for the KL term
            with torch.no_grad(), self.params.reference_policy(self.policy):
                ref_mean = self.policy.step(x, t, cond, self.plan.noise_level, prev_sample=prev).mean
            dt = (self.policy.sigmas[t - 1] - self.policy.sigmas[t]).to(dev)
        terms = pair_loss(out.log_prob, old, A, clip_range=self.cfg.clip_range, beta_kl=self.cfg.beta_kl,
                          mean=out.mean, ref_mean=ref_mean, std=out.std, dt=dt, kl_form=self.cfg.kl_form)
        parts = {key: float(value.detach().sum()) for key, value in terms._asdict().items()}
        return terms.loss.sum(), parts

    def update(self, batch: Batch, adv_t: torch.Tensor, step: int) -> dict[str, float]:
        """``updates_per_step`` optimizer steps over this iteration's (image, trained step) pairs."""
        cfg = self.cfg
        pairs = np.array([(b, t) for b in range(len(batch.prompts)) for t in self.trained_steps], dtype=np.int64)
        pairs = pairs[update_rng(cfg.seed, step).permutation(len(pairs))]
        totals = dict.fromkeys(PairLoss._fields, 0.0)
        grad_norm = 0.0
        model = self.policy.denoiser
        for chunk in np.array_split(pairs, cfg.updates_per_step):
            micro = [chunk[i: i + cfg.micro_batch] for i in range(0, len(chunk), cfg.micro_batch)]
            chunk_loss = 0.0
            for k, part in enumerate(micro):
                last = k == len(micro) - 1
                sync = self.acc.no_sync(model) if self.engine == "ddp" and not last else contextlib.nullcontext()
                with sync:
                    loss, parts = self.pair_loss(batch, adv_t, part)
                    self.acc.backward(loss / len(chunk))
                for key in totals:
                    totals[key] += parts[key]
                chunk_loss += parts["loss"]
            if self.fsdp:  # the norm over every process's shards
                grad_norm = clip_grad_norm(self.params.tensors, cfg.grad_clip)
            else:
                grad_norm = float(self.acc.clip_grad_norm_(self.params.tensors, cfg.grad_clip))
            self.stop_unless_finite(math.isfinite(chunk_loss), step, "the loss")
            self.stop_unless_finite(math.isfinite(grad_norm), step, "the gradient norm")
            self.stop_unless_finite(self.optimizer_step(), step, "the updated weights")
            if self.ema is not None:
                with torch.no_grad():
                    for name, p in self.params.named:
                        self.ema[name].mul_(cfg.ema_decay).add_(p.detach(), alpha=1 - cfg.ema_decay)
        n = len(pairs)
        stats = {key: value / n for key, value in totals.items()}
        stats["clip_frac"] = stats.pop("clipped")
        stats["grad_norm"] = grad_norm
        if self.world > 1:
            reduced = self.acc.reduce(torch.tensor([stats["policy_loss"], stats["kl"], stats["clip_frac"],
                                                    stats["loss"]], device=self.acc.device), "mean").cpu()
            stats.update(zip(("policy_loss", "kl", "clip_frac", "loss"), (float(v) for v in reduced)))
        return stats

    def optimizer_step(self) -> bool:
        """One AdamW step; whether every trained tensor (this process's shards) is finite after it.

        A step too large for the weights' dtype (a learning rate of 1e300) makes torch refuse to
        cast it ("cannot be converted ... without overflow"): that, too, is weights gone non-finite.
        """
        try:
            self.optimizer.step()
        except RuntimeError as exc:
            if "overflow" not in str(exc):
                raise
            return False
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        return bool(torch.stack([torch.isfinite(local_part(p.detach())).all() for p in self.params.tensors]).all())

    def stop_unless_finite(self, ok: bool, step: int, what: str) -> None:
        """Stop training with one line (BadInput, exit 2) unless ``ok`` holds on every process.

        Called before the step's metrics row and checkpoint, so a non-finite loss, gradient, weight
        or image leaves the run as its last checkpoint left it: it is never saved, or trained on.
        Under several processes all agree first (one of them alone stopping would leave the others
        waiting in the next collective forever).
        """
        if self.world > 1:
            bad = torch.tensor([0.0 if ok else 1.0], device=self.acc.device)
            ok = float(self.acc.reduce(bad, "sum")) == 0.0
        if not ok:
            raise BadInput(f"training stopped at step {step + 1}: {what} became non-finite (inf or nan); nothing of "
                           "that step was saved, earlier checkpoints are kept; lower learning_rate or check the "
                           "rewards, then resume or restart")

    def local_groups(self) -> range:
        per = self.cfg.prompts_per_step // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path | None:
        """Write a checkpoint of the current iteration (rank 0; every process gathers first)."""
        return self.folder.save(self.iteration, params=self.params, optimizer=self.optimizer, ema=self.ema,
                                rank=self.rank)


def fsdp_blocks(kind: str) -> tuple[str, ...]:
    """The transformer blocks FSDP shards one by one for a setting's ``[policy] kind``: the family table's
    (the 1-D world's network: none, it is sharded whole)."""
    return FAMILIES[kind].blocks if kind in FAMILIES else ()

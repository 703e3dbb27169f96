"""``recast preflight`` phases ``estimate``, ``train`` and ``evaluate``: the stages' own code on a
random-weight pipeline, measured, with the batch halved on a CUDA out-of-memory until it fits.

Each phase runs one unit of its stage at the setting's sizes:

* ``estimate``: one rollout batch of ``recast estimate`` (E6, π⁺-sampling) on the ``[study]``
  grid (``estimate_steps``) with its N and K: positives from the toy renderer, encoded by the
  VAE, noised to every t (``noised_starts``), and ``batch_size`` of the prompt's N·T·K jobs,
  spread evenly over the jobs so they start at every t, rolled out to x_0 as mixed-t batches,
  decoded and scored. The whole prompt's cost is projected from the batch's denoiser steps.
* ``train``: one ``Trainer.train_step`` at the ``[train]`` recipe for one prompt group of G
  images (sampling with log-probs, rewards, E13 advantages, the PPO + KL update with LoRA and
  the adapter-off reference, AdamW, EMA), once eager and once with ``compile``.
* ``evaluate``: one ``[evaluate]`` chunk of ``batch_size`` deterministic ODE samples
  (``sample_chunk``), decoded to 8-bit images and scored (``score_chunk``).

Rewards and judges are all :data:`STAND_IN` (a registered, weight-free scorer on the host);
prompts are the toy world's, which it reads. Neither changes the shapes the model sees (the
text encoders pad to fixed lengths). On ``torch.cuda.OutOfMemoryError`` a phase is run again
at half its batch (:func:`fit`); the record keeps every size tried and the largest that fit.
"""

from __future__ import annotations

import gc
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: the scorer standing in for every reward and judge: registered, weight-free, numpy on the host
STAND_IN = "toy_sharpness"
SEED = 0


def host_rss_peak() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release(device: torch.device) -> None:
    """Return what a failed attempt held, so the next one starts from the resident weights."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measured(device: torch.device, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``work()``'s record plus its seconds, images/s (``work`` reports ``images``) and peak memory."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = work()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return {**out, "seconds": round(seconds, 3), "images_per_s": round(out["images"] / max(seconds, 1e-9), 3),
            "peak_device_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "host_rss_peak_bytes": host_rss_peak()}


def fit(run: Callable[[int], dict[str, Any]], batch: int, device: torch.device) -> dict[str, Any]:
    """``run(batch)``, halving ``batch`` after each CUDA out-of-memory until one fits or 1 does not.

    The record: ``asked``, every size ``tried``, ``largest_fit`` (None if even 1 ran out of
    memory), ``fits`` (the asked size ran), and the fitting run's own record.
    """
    tried: list[int] = []
    while batch >= 1:
        tried.append(batch)
        out_of_memory = False
        try:
            result = run(batch)
        except torch.cuda.OutOfMemoryError:
            out_of_memory = True
        if not out_of_memory:
            return {"asked": tried[0], "tried": tried, "largest_fit": batch, "fits": batch == tried[0], **result}
        release(device)  # outside the handler: the traceback's frames no longer hold the attempt's tensors
        batch //= 2
    return {"asked": tried[0], "tried": tried, "largest_fit": None, "fits": False}


@dataclass(frozen=True)
class Bench:
    """What every phase runs on: the random-weight pipeline, the setting and where it runs."""

    pipe: Any  # StableDiffusion3Pipeline, materialised on ``device``
    setting: Any
    device: torch.device
    precision: str  # SD3Policy's: the setting's on CUDA, "no" on the CPU
    resolution: int | None  # None: the pipeline's own size (the tiny scale)
    prompts: tuple[str, ...]

    def policy(self, steps: int, guidance_scale: float | None = None):
        from recast_cli.policy.sd3 import SD3Policy

        spec = self.setting.policy
        return SD3Policy(self.pipe, steps, spec.guidance_scale if guidance_scale is None else guidance_scale,
                         self.resolution, spec.max_sequence_length, self.precision, self.device)

    def stand_ins(self, count: int) -> list:
        from recast_cli.rewards import build_scorer

        return [build_scorer(STAND_IN) for _ in range(count)]


def estimate_phase(bench: Bench, rewards: int, steps: int, N: int, K: int, batch: int,
                   prompts_total: int | None) -> dict[str, Any]:
    """One rollout batch of ``recast estimate`` at T = ``steps``, N, K (halved on out-of-memory)."""
    from recast_cli.estimate.rollouts import RolloutPlan, noised_starts, score_endpoints
    from recast_cli.estimate.config import EstimateConfig
    from recast_cli.seeds import renderer_seeds
    from recast_cli.toy.renderer import render_batch

    policy = bench.policy(steps)
    prompt = bench.prompts[0]
    scorers = bench.stand_ins(rewards)
    rollout_noise = EstimateConfig.rollout_noise

    def run(size: int) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            plan = RolloutPlan(K=K, rollout_noise=rollout_noise, seed=SEED, batch_size=size)
            images = render_batch([prompt] * N, renderer_seeds(SEED, 0, N), policy.resolution)
            x0 = policy.encode(images.to(policy.device))
            starts, t, seeds, _, _ = noised_starts(policy, x0, plan, 0, 0)
            pick = np.unique(np.linspace(0, len(t) - 1, min(size, len(t))).round().astype(np.int64))
            cond = policy.encode_prompts([prompt]).take(torch.zeros(len(pick), dtype=torch.long))
            ends = policy.rollout(starts[torch.from_numpy(pick).to(starts.device)], torch.from_numpy(t[pick]), cond,
                                  rollout_noise, torch.from_numpy(seeds[pick]))
            scores = score_endpoints(policy, ends, prompt, scorers)
            return {"images": len(pick), "denoiser_steps": int(t[pick].sum()),
                    "finite": bool(np.isfinite(scores).all())}

        out = measured(policy.device, work)
        per_prompt = N * K * steps * (steps + 1) // 2  # every job (n, t, k) runs t steps
        out["projected_prompt_seconds"] = round(out["seconds"] * per_prompt / out["denoiser_steps"], 1)
        if prompts_total:
            out["projected_estimate_seconds"] = round(out["projected_prompt_seconds"] * prompts_total, 1)
        return out

    record = fit(run, min(batch, N * steps * K), bench.device)
    return {"T": steps, "N": N, "K": K, "rollout_noise": rollout_noise, "prompts": prompts_total, **record}


def _drop_adapters(transformer) -> None:
    """Remove the LoRA adapter a trainer added, so the next one starts from the bare transformer."""
    names = list(getattr(transformer, "peft_config", None) or {})
    if names:
        transformer.delete_adapters(names)


def train_phase(bench: Bench, cfg, compile_: bool) -> dict[str, Any]:
    """One ``Trainer.train_step`` for one group of G images (micro-batch halved on out-of-memory)."""
    from recast_cli.train.config import trained_steps
    from recast_cli.train.plan import Plan, run_noise_level, static_run_weights
    from recast_cli.train.trainer import Trainer

    spec = bench.setting.policy

    def run(micro: int) -> dict[str, Any]:
        policy = bench.policy(spec.steps)
        one = replace(cfg, prompts_per_step=1, max_steps=1, micro_batch=micro, compile=compile_,
                      sample_batch=min(cfg.sample_batch, micro))
        weights = static_run_weights(cfg, policy.sigmas.flip(0).numpy())
        with tempfile.TemporaryDirectory(prefix="recast-preflight-") as tmp:
            plan = Plan(bench.setting, one, weights, "static", list(bench.prompts), Path(tmp) / "run", None, None,
                        str(bench.device), trained_steps(policy.T, cfg.train_fraction), run_noise_level(one, spec))
            try:
                with Trainer(plan, quiet=True, loggers=False, policy=policy,
                             scorers=bench.stand_ins(len(cfg.rewards))) as trainer:

                    def work() -> dict[str, Any]:
                        s = trainer.train_step()["scalars"]
                        return {"images": cfg.group_size, "pairs": cfg.group_size * len(trainer.trained_steps),
                                "sample_seconds": round(s["sample_s"], 3), "update_seconds": round(s["update_s"], 3),
                                "loss": s["loss"], "kl": s["kl"],
                                "finite": bool(np.isfinite([s["loss"], s["kl"]]).all())}

                    out = measured(bench.device, work)
                    return {**out, "trainable": trainer.params.count(), "engine": trainer.engine,
                            "sample_batch": one.sample_batch}
            finally:
                _drop_adapters(policy.network)

    record = fit(run, cfg.micro_batch, bench.device)
    return {"compile": compile_, "compile_backend": cfg.compile_backend if compile_ else None,
            "group_size": cfg.group_size, "T": spec.steps, "lora_rank": cfg.lora_rank, "beta_kl": cfg.beta_kl,
            "ema_decay": cfg.ema_decay, **record}


def evaluate_phase(bench: Bench) -> dict[str, Any]:
    """One ``[evaluate]`` chunk: ``batch_size`` ODE samples, 8-bit images, scored (halved on out-of-memory)."""
    from recast_cli.artifacts import EvalImage
    from recast_cli.evaluate.config import config_from_setting
    from recast_cli.evaluate.stage import EvalPlan, EvalWorld, sample_chunk, score_chunk
    from recast_cli.evaluate.target import Target
    from recast_cli.seeds import image_seed

    ecfg, tcfg = config_from_setting(bench.setting)
    spec = bench.setting.policy
    steps = ecfg.steps if ecfg.steps is not None else spec.steps
    guidance = ecfg.guidance_scale if ecfg.guidance_scale is not None else spec.guidance_scale
    policy = bench.policy(steps, guidance)
    # the stage's plan, for score_chunk's scorer names; nothing is written to its ``out``
    plan = EvalPlan(Target(bench.setting, "base"), ecfg, list(bench.prompts), tcfg.rewards, tcfg.lam, {},
                    Path("preflight-evaluate.parquet"), str(bench.device))
    world = EvalWorld(policy, bench.stand_ins(len(plan.scorers)), None, steps, float(guidance))

    def run(size: int) -> dict[str, Any]:
        chunk = [EvalImage(image_id=i, prompt_id=i, prompt=bench.prompts[i % len(bench.prompts)],
                           seed=image_seed(ecfg.seed, i, 0), image_path="") for i in range(size)]

        def work() -> dict[str, Any]:
            pictures = sample_chunk(world, chunk)
            scores = score_chunk(plan, world, pictures, [im.prompt for im in chunk])
            return {"images": len(pictures), "finite": bool(np.isfinite(list(scores.values())).all())}

        return measured(bench.device, work)

    record = fit(run, ecfg.batch_size, bench.device)
    return {"T": steps, "guidance_scale": guidance, "scorers": len(plan.scorers), **record}

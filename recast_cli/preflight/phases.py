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

* ``rewards``: each in-process reward and judge network alone, one ``batch_size`` chunk scored.

The rewards and judges with a network (clip, pick, hps, aesthetic, imagereward) are their real
architectures on random weights where the setting puts them (:mod:`recast_cli.preflight.rewards`);
every other name is :data:`STAND_IN` (a registered, weight-free scorer on the host). Prompts are
the toy world's; neither changes the shapes the models see (the encoders pad to fixed lengths).
Each phase runs the policy with the text encoders where ``[policy] offload_text_encoders`` puts
them; the train phase runs its eager step once more with the other choice, so the table shows the
peak memory with and without offload. On ``torch.cuda.OutOfMemoryError`` a phase is run again
at half its batch (:func:`fit`); the record keeps every size tried and the largest that fit.
"""

from __future__ import annotations

import gc
import resource
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recast_cli.preflight.rewards import RewardModel, build_reward_model, empty, placement, reward_options, where
from recast_cli.rewards.base import Images, Scorer, as_float, check_batch, chunks

#: the scorer standing in for every reward and judge without a network: registered, weight-free, on the host
STAND_IN = "toy_sharpness"
SEED = 0
#: how :func:`materialise` initialises random weights (recorded in the JSON)
INIT = "reset_parameters per layer, else norm scales 1, biases 0, N(0, 0.02^2); seeded per component"


def materialise(module, device, dtype, seed: int):
    """Allocate a module's ``meta`` parameters on ``device`` in ``dtype`` (every floating tensor
    cast as ``from_pretrained(dtype=…)`` would, before allocation, so no fp32 copy of T5-XXL ever
    exists) and initialise them there, deterministically.

    Every layer with its own ``reset_parameters`` (Linear, Conv, Embedding, LayerNorm, GroupNorm,
    …) initialises itself as PyTorch does, after ``torch.manual_seed(seed)``; any other parameter
    is a norm scale (a 1-D ``weight``: ones), a bias (zeros) or seeded N(0, 0.02²). Buffers were
    built with their values on the CPU (sin-cos position tables, position ids) and are copied over.
    A transformers model's tied parameters (T5's shared embedding) are tied again (``tie_weights``).
    """
    import torch

    module.to(dtype)  # still on meta: the device memory is allocated once, in ``dtype``
    buffers = dict(module.named_buffers())
    module.to_empty(device=device)
    if callable(getattr(module, "tie_weights", None)):
        module.tie_weights()
    torch.manual_seed(seed)
    done: set[int] = set()
    for sub in module.modules():
        own = list(sub.parameters(recurse=False))
        if own and callable(getattr(sub, "reset_parameters", None)):
            sub.reset_parameters()
            done.update(id(p) for p in own)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if id(p) in done:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias":
                p.zero_()
            elif leaf == "weight" and p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        for name, value in buffers.items():
            module.get_buffer(name).copy_(value)
    return module


class ArchitectureScorer(Scorer):
    """A reward's real network with random weights, scoring as its scorer does at the scorer's shapes:
    images resized to the model's input (bilinear), prompts as fixed-length token ids (random weights
    need the shapes, not the language), chunks of the scorer's ``batch_size``."""

    def __init__(self, model: RewardModel, device: torch.device, batch_size: int, seed: int) -> None:
        self.name = model.name
        self.image_size, self.text_tokens, self.vocab, self.forward = (model.image_size, model.text_tokens,
                                                                        model.vocab, model.score)
        self.device = device
        self.batch_size = batch_size
        self.module = materialise(model.module, device, torch.float32, seed).eval().requires_grad_(False)
        model.module = None  # this scorer holds the only reference: close() frees the weights
        self.generator = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def score(self, images: Images, prompts: Sequence[str]) -> np.ndarray:
        count = check_batch(self.name, images, prompts)
        pixels = torch.stack(as_float(images))
        out = np.empty(count, dtype=np.float64)
        for part in chunks(count, self.batch_size):
            batch = torch.nn.functional.interpolate(pixels[part], size=(self.image_size,) * 2, mode="bilinear",
                                                    antialias=True).to(self.device)
            n, length = batch.shape[0], max(self.text_tokens, 1)
            ids = torch.randint(0, self.vocab, (n, length), generator=self.generator).to(self.device)
            out[part] = self.forward(self.module, batch, ids, torch.ones_like(ids)).double().cpu().numpy()
        return out

    def close(self) -> None:
        self.module = None


def build_scorers(names: Sequence[str], setting, scale: str, device: torch.device,
                  stand_in: Callable[[], Scorer]) -> list[Scorer]:
    """The scorers a phase runs: an :class:`ArchitectureScorer` per model reward (on ``device`` when the
    setting puts it on CUDA, else on the CPU), ``stand_in()`` for every other name."""
    options = reward_options(setting)
    scorers: list[Scorer] = []
    for seed, name in enumerate(names):
        if placement(name)[0] != "model":
            scorers.append(stand_in())
            continue
        opts = options.get(name, {})
        on = device if where(opts) == "cuda" or device.type == "cpu" else torch.device("cpu")
        with empty():
            model = build_reward_model(name, opts, scale)
        scorers.append(ArchitectureScorer(model, on, int(opts.get("batch_size", 16)), 100 + seed))
    return scorers


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
    scale: str = "full"

    def offload(self, trainable: int) -> bool:
        """``[policy] offload_text_encoders``, or its default rule for a stage that trains ``trainable``."""
        from recast_cli.policy.pipeline import offload_by_default

        chosen = self.setting.policy.offload_text_encoders
        return offload_by_default(self.pipe, trainable) if chosen is None else chosen

    def policy(self, steps: int, guidance_scale: float | None = None, offload: bool | None = None):
        from recast_cli.policy.sd3 import SD3Policy

        spec = self.setting.policy
        return SD3Policy(self.pipe, steps, spec.guidance_scale if guidance_scale is None else guidance_scale,
                         self.resolution, spec.max_sequence_length, self.precision, self.device,
                         self.offload(0) if offload is None else offload)

    def scorers(self, names) -> list:
        """The phase's scorers: the real networks of the model rewards, :data:`STAND_IN` for the rest."""
        from recast_cli.rewards import build_scorer

        return build_scorers(list(names), self.setting, self.scale, self.device, lambda: build_scorer(STAND_IN))


def closed(scorers: list) -> None:
    for scorer in scorers:
        scorer.close()


def estimate_phase(bench: Bench, rewards: tuple[str, ...], steps: int, N: int, K: int, batch: int,
                   prompts_total: int | None) -> dict[str, Any]:
    """One rollout batch of ``recast estimate`` at T = ``steps``, N, K (halved on out-of-memory)."""
    from recast_cli.estimate.rollouts import RolloutPlan, noised_starts, score_endpoints
    from recast_cli.estimate.config import EstimateConfig
    from recast_cli.seeds import renderer_seeds
    from recast_cli.toy.renderer import render_batch

    policy = bench.policy(steps)
    prompt = bench.prompts[0]
    scorers = bench.scorers(rewards)
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

    try:
        record = fit(run, min(batch, N * steps * K), bench.device)
    finally:
        closed(scorers)
    return {"T": steps, "N": N, "K": K, "rollout_noise": rollout_noise, "prompts": prompts_total,
            "offload_text_encoders": policy.offload_text_encoders, **record}


def _drop_adapters(transformer) -> None:
    """Remove the LoRA adapter a trainer added, so the next one starts from the bare transformer."""
    names = list(getattr(transformer, "peft_config", None) or {})
    if names:
        transformer.delete_adapters(names)


def train_phase(bench: Bench, cfg, compile_: bool, offload: bool) -> dict[str, Any]:
    """One ``Trainer.train_step`` for one group of G images (micro-batch halved on out-of-memory), the text
    encoders offloaded or not."""
    from recast_cli.train.config import trained_steps
    from recast_cli.train.plan import Plan, run_noise_level, static_run_weights
    from recast_cli.train.trainer import Trainer

    spec = bench.setting.policy

    def run(micro: int) -> dict[str, Any]:
        policy = bench.policy(spec.steps, offload=offload)
        one = replace(cfg, prompts_per_step=1, max_steps=1, micro_batch=micro, compile=compile_,
                      sample_batch=min(cfg.sample_batch, micro))
        weights = static_run_weights(cfg, policy.sigmas.flip(0).numpy())
        with tempfile.TemporaryDirectory(prefix="recast-preflight-") as tmp:
            plan = Plan(bench.setting, one, weights, "static", list(bench.prompts), Path(tmp) / "run", None, None,
                        str(bench.device), trained_steps(policy.T, cfg.train_fraction), run_noise_level(one, spec))
            scorers = bench.scorers(cfg.rewards)
            try:
                with Trainer(plan, quiet=True, loggers=False, policy=policy, scorers=scorers) as trainer:

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
                closed(scorers)
                _drop_adapters(policy.network)

    record = fit(run, cfg.micro_batch, bench.device)
    return {"compile": compile_, "compile_backend": cfg.compile_backend if compile_ else None,
            "offload_text_encoders": offload,
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
    world = EvalWorld(policy, bench.scorers([name for name, _ in plan.scorers]), None, steps, float(guidance))

    def run(size: int) -> dict[str, Any]:
        chunk = [EvalImage(image_id=i, prompt_id=i, prompt=bench.prompts[i % len(bench.prompts)],
                           seed=image_seed(ecfg.seed, i, 0), image_path="") for i in range(size)]

        def work() -> dict[str, Any]:
            pictures = sample_chunk(world, chunk)
            scores = score_chunk(plan, world, pictures, [im.prompt for im in chunk])
            return {"images": len(pictures), "finite": bool(np.isfinite(list(scores.values())).all())}

        return measured(bench.device, work)

    try:
        record = fit(run, ecfg.batch_size, bench.device)
    finally:
        closed(world.scorers)
    return {"T": steps, "guidance_scale": guidance, "scorers": len(plan.scorers),
            "offload_text_encoders": policy.offload_text_encoders, **record}


def rewards_phase(bench: Bench, names: tuple[str, ...]) -> dict[str, Any]:
    """Each model reward and judge alone: materialised where the setting puts it, one chunk of its
    ``batch_size`` images at the setting's resolution scored (seconds, images/s, peak memory with the
    pipeline's weights resident)."""
    side = bench.resolution or 64
    out: dict[str, Any] = {}
    for name in names:
        if placement(name)[0] != "model":
            continue
        scorer = bench.scorers([name])[0]
        images = torch.rand(scorer.batch_size, 3, side, side, generator=torch.Generator().manual_seed(SEED))

        def work() -> dict[str, Any]:
            scores = scorer.score(images, [bench.prompts[0]] * len(images))
            return {"images": len(images), "finite": bool(np.isfinite(scores).all()), "device": str(scorer.device),
                    "batch": scorer.batch_size}

        try:
            out[name] = measured(bench.device, work)
        finally:
            scorer.close()
            release(bench.device)
    return out

"""`recast train` on the toy model: sampling and update throughput against a plain Flow-GRPO-style loop.

All sides do the same work on the same model, the same LoRA and the same optimizer, and the
ratios are measured in this process (best of ``--repeats`` on each side, the sides rotating
which runs first so background load hits them alike). recast runs twice: as the setting
ships it (``compile = false``, eager PyTorch) and with ``compile = true`` (the denoiser
through ``torch.compile``, inductor); the baseline is always eager:

* **Sampling** — recast: ``Trainer.sample`` (all groups in ``sample_batch`` chunks, prompt
  embeddings from the policy's cache, rewards scored in a worker thread while the next chunk
  samples). Baseline: one prompt group (G images) at a time, each with its own text-encoding
  call (no cache; the empty negative prompt is encoded once up front, as Flow-GRPO does), the
  same SDE sampler and noise seeds, a VAE decode per group, and all rewards scored after all
  sampling. Same prompts and seeds, so the sides give the same states (checked).
* **Update** — recast: ``Trainer.update`` (every (image, trained step) pair of a micro-batch in
  one forward/backward at per-sample timesteps; gradient accumulation; one AdamW step).
  Baseline: Flow-GRPO's train loop, one forward/backward per trained step, each a full-batch
  call at that one timestep, with the same loss (``ppo_terms`` + β·``gaussian_kl`` to the
  adapter-off reference, summed over pairs and divided by their number), the same grad-norm
  clipping and the same AdamW step. Every update starts from the same parameters and optimizer
  state; in the first repeat every side also records the gradients its optimizer step sees, and
  the run stops unless each recast side agrees with the baseline (allclose; the max abs diff is
  printed) before any further timing.

Compilation happens in an untimed warm-up (one compiled sample and one compiled update, whose
time is printed: torch caches compiled kernels on disk, so it is minutes the first time on a
machine and seconds after). The timed repeats are the steady state of a run.

The table gives seconds and images/s (images sampled per step / seconds) for each side, the
ratio baseline/recast of the best times, and the median of the per-repeat ratios (each repeat
runs all sides back to back, so that ratio is the less load-sensitive one on a busy machine).
"overall" is sample + update, the time of one training step.

The prompt-embedding cache is warm (the steady state of a run: the toy setting's 24 prompts are
all cached after its first few steps). The fresh adapter's ``lora_B`` (zero at init) is set to
small random values first, so every LoRA tensor gets a gradient and the KL term is active.

Run: python -m benchmarks.bench_train [--prompts 8] [--group-size 8] [--repeats 5]
     [--micro-batch N] [--threads N] [--no-compile] [--json FILE|-]
(about two minutes on 2 idle CPU cores with the defaults, plus the first compilation: the toy
setting's 8 prompts × G = 8, micro_batch 96, sample_batch 64; several times longer when other
jobs share the cores.)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from recast_cli.policy.sd3 import SD3Conditioning
from recast_cli.setting.prompts import prompt_stream
from recast_cli.train.objective import gaussian_kl, ppo_terms
from recast_cli.seeds import train_seeds
from recast_cli.train.plan import plan_run
from recast_cli.train.trainer import Batch, Trainer

SETTING = "toy"
SAMPLE_STEP = 1  # the training step whose prompts and noise both sides sample


def build_trainer(prompts: int, group_size: int, micro_batch: int | None, out: Path, compile: bool = False) -> Trainer:
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import apply_overrides, config_from_setting

    s = load_setting(SETTING)
    cfg = config_from_setting(s)
    sets = ([f"micro_batch={micro_batch}"] if micro_batch else []) + (["compile=true"] if compile else [])
    cfg = apply_overrides(cfg, sets, {"prompts_per_step": prompts, "group_size": group_size})
    plan = plan_run(s, cfg, "static", out, False, None, "cpu")
    return Trainer(plan, quiet=True, loggers=False)


def run_eager(tr: Trainer, fn):
    """``fn`` with the policy calling the plain (uncompiled) transformer while it runs."""
    def run(*args):
        live, tr.policy.denoiser = tr.policy.denoiser, tr.policy.pipe.transformer
        try:
            return fn(*args)
        finally:
            tr.policy.denoiser = live
    return run


# ------------------------------------------------------------------ the baseline


class Baseline:
    """A straightforward Flow-GRPO-style loop over the trainer's policy, LoRA and optimizer."""

    def __init__(self, trainer: Trainer):
        self.tr = trainer
        self.policy = trainer.policy
        pipe = self.policy.pipe
        with torch.no_grad():  # Flow-GRPO encodes the negative (empty) prompt once per run
            neg, _, neg_pooled, _ = pipe.encode_prompt(
                prompt=[""], prompt_2=None, prompt_3=None, device=self.policy.device,
                do_classifier_free_guidance=False, max_sequence_length=self.policy.max_sequence_length)
        self.neg, self.neg_pooled = neg.float(), neg_pooled.float()
        self.encode_s = 0.0
        self.score_s = 0.0

    def encode(self, prompts: list[str]) -> SD3Conditioning:
        """One text-encoding call for a batch's prompts (duplicates included), no cache."""
        t0 = time.perf_counter()
        embeds, _, pooled, _ = self.policy.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.policy.device,
            do_classifier_free_guidance=False, max_sequence_length=self.policy.max_sequence_length)
        n = len(prompts)
        cond = SD3Conditioning(embeds.float(), pooled.float(), self.neg.expand(n, -1, -1),
                               self.neg_pooled.expand(n, -1))
        self.encode_s += time.perf_counter() - t0
        return cond

    @torch.no_grad()
    def sample(self, step: int) -> Batch:
        tr, cfg, G = self.tr, self.tr.cfg, self.tr.cfg.group_size
        order = prompt_stream(len(tr.plan.prompts), cfg.seed, step * cfg.prompts_per_step, cfg.prompts_per_step)
        self.encode_s = self.score_s = 0.0
        prompts, conds, states, log_probs, images = [], [], [], [], []
        for g in range(cfg.prompts_per_step):  # one prompt group per sampling call
            group = [tr.plan.prompts[int(order[g])]] * G
            index = np.arange(g * G, (g + 1) * G, dtype=np.int64)
            cond = self.encode(group)
            traj = self.policy.sample(cond, tr.plan.noise_level, torch.from_numpy(train_seeds(cfg.seed, step, index)))
            prompts += group
            conds.append(cond)
            states.append(traj.states)
            log_probs.append(traj.log_probs)
            images.append(self.policy.decode(traj.states[:, -1]))
        t0 = time.perf_counter()  # rewards after all sampling
        rewards = tr._score(torch.cat(images), prompts)
        self.score_s = time.perf_counter() - t0
        return Batch(prompts, SD3Conditioning.cat(conds), torch.cat(states), torch.cat(log_probs), rewards)

    def update(self, batch: Batch, adv_t: torch.Tensor) -> float:
        """One forward/backward per trained step over the full batch, then one AdamW step."""
        tr, cfg, policy = self.tr, self.tr.cfg, self.policy
        B = len(batch.prompts)
        n = B * len(tr.trained_steps)
        for t in tr.trained_steps:
            j = tr.T - t
            x, prev = batch.states[:, j], batch.states[:, j + 1]
            steps = torch.full((B,), t, dtype=torch.long)
            out = policy.step(x, steps, batch.cond, tr.plan.noise_level, prev_sample=prev)
            pg, _ = ppo_terms(out.log_prob, batch.log_probs[:, j], adv_t[:, t - 1].to(out.log_prob.dtype),
                              cfg.clip_range)
            loss = pg
            if cfg.beta_kl > 0:
                with torch.no_grad(), tr.params.reference_policy(policy):
                    ref = policy.step(x, steps, batch.cond, tr.plan.noise_level, prev_sample=prev)
                dt = torch.full((B,), float(policy.sigmas[t - 1] - policy.sigmas[t]))
                loss = pg + cfg.beta_kl * gaussian_kl(out.mean, ref.mean, out.std, dt, cfg.kl_form)
            (loss.sum() / n).backward()
        norm = torch.nn.utils.clip_grad_norm_(tr.params.tensors, cfg.grad_clip)
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        return float(norm)


# ------------------------------------------------------------------ state and gradient capture


@dataclass
class Snapshot:
    params: list[torch.Tensor]
    optimizer: dict

    @staticmethod
    def take(tr: Trainer) -> Snapshot:
        return Snapshot([p.detach().clone() for p in tr.params.tensors], copy.deepcopy(tr.optimizer.state_dict()))

    def restore(self, tr: Trainer) -> None:
        with torch.no_grad():
            for p, saved in zip(tr.params.tensors, self.params):
                p.copy_(saved)
        tr.optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        tr.optimizer.zero_grad(set_to_none=True)


def capture_grads(tr: Trainer, run) -> tuple[list[torch.Tensor], object]:
    """Run ``run()`` and return the gradients the optimizer step saw (after clipping) and its result."""
    seen: list[torch.Tensor] = []
    step = tr.optimizer.step

    def recording_step(*args, **kwargs):
        seen.extend(p.grad.detach().clone() for p in tr.params.tensors)
        return step(*args, **kwargs)

    tr.optimizer.step = recording_step
    try:
        result = run()
    finally:
        del tr.optimizer.step
    return seen, result


def perturb_adapter(tr: Trainer, std: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in tr.params.named:
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


# ------------------------------------------------------------------ the benchmark


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompt groups per step (default 8)")
    ap.add_argument("--group-size", type=int, default=8, help="images per prompt G (default 8)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per side, best taken (default 5)")
    ap.add_argument("--micro-batch", type=int, default=None, help="trainer micro_batch (default: the setting's)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile = true side")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    console = Console(width=200, stderr=args.json == "-")

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    compiled = not args.no_compile
    with tempfile.TemporaryDirectory() as tmp:
        tr = build_trainer(args.prompts, args.group_size, args.micro_batch, Path(tmp) / "run", compile=compiled)
        cfg = tr.cfg
        perturb_adapter(tr)
        base = Baseline(tr)
        tr.policy.encode_prompts(tr.plan.prompts)  # warm cache: the steady state after a run's first steps
        images = cfg.prompts_per_step * cfg.group_size
        pairs = images * len(tr.trained_steps)
        console.print(f"toy model, T = {tr.T}, {cfg.prompts_per_step} prompts × G = {cfg.group_size} = {images} images, "
                      f"{len(tr.trained_steps)} trained steps = {pairs} pairs; recast micro_batch {cfg.micro_batch}, "
                      f"sample_batch {cfg.sample_batch}; torch threads {torch.get_num_threads()}")
        sides = ["base", "recast"] + (["compiled"] if compiled else [])
        samplers = {"base": run_eager(tr, base.sample), "recast": run_eager(tr, tr.sample), "compiled": tr.sample}

        start = Snapshot.take(tr)
        compile_s = None
        if compiled:  # compilation happens here, untimed: the first compiled sample and update
            t0 = time.perf_counter()
            warm = tr.sample(SAMPLE_STEP)
            _, warm_adv = tr.advantages(tr.gather_rewards(warm))
            tr.update(warm, warm_adv, SAMPLE_STEP)
            start.restore(tr)
            compile_s = time.perf_counter() - t0
            console.print(f"compile = true warm-up (first compiled sample + update, compilation included): "
                          f"{compile_s:.1f} s")

        # -- sampling: the same states on all sides, then timing
        times = {f"{side}_{stage}": [] for side in sides for stage in ("sample", "update")}
        base_parts = {"encode": [], "score": []}
        batches = {}
        for r in range(args.repeats):
            order = sides[r % len(sides):] + sides[:r % len(sides)]
            for side in order:
                t0 = time.perf_counter()
                batches[side] = samplers[side](SAMPLE_STEP)
                times[f"{side}_sample"].append(time.perf_counter() - t0)
                if side == "base":
                    base_parts["encode"].append(base.encode_s)
                    base_parts["score"].append(base.score_s)
            if r == 0:
                ref = batches["base"]
                for side in sides[1:]:
                    b = batches[side]
                    ds = float((b.states - ref.states).abs().max())
                    dl = float((b.log_probs - ref.log_probs).abs().max())
                    dr = float((b.rewards - ref.rewards).abs().max())
                    console.print(f"sampling check, {side} vs baseline: max |Δ states| {ds:.2e}, "
                                  f"|Δ log-probs| {dl:.2e}, |Δ rewards| {dr:.2e}")
                    if not (ds < 1e-3 and dl < 1e-3 and dr < 1e-3):
                        raise SystemExit(f"the {side} sampler and the baseline do not give the same samples")
            console.print(f"  sampling repeat {r + 1}: " + ", ".join(
                f"{side} {times[f'{side}_sample'][-1]:.2f} s" for side in sides))

        batch = batches["recast"]  # every side updates on the same batch
        _, adv_t = tr.advantages(tr.gather_rewards(batch))
        updaters = {"base": run_eager(tr, lambda: base.update(batch, adv_t)),
                    "recast": run_eager(tr, lambda: tr.update(batch, adv_t, SAMPLE_STEP)["grad_norm"]),
                    "compiled": lambda: tr.update(batch, adv_t, SAMPLE_STEP)["grad_norm"]}

        # -- update: the first repeat of each side records the gradients its optimizer step sees; all
        # start from the same parameters and optimizer state, and must agree before any more timing
        checks = {}
        for r in range(args.repeats):
            order = sides[r % len(sides):] + sides[:r % len(sides)]
            grads = {}
            for side in order:
                start.restore(tr)
                t0 = time.perf_counter()
                grads[side] = capture_grads(tr, updaters[side]) if r == 0 else updaters[side]()
                times[f"{side}_update"].append(time.perf_counter() - t0)
            if r == 0:
                g_b, n_b = grads["base"]
                scale = max(float(g.abs().max()) for g in g_b)
                for side in sides[1:]:
                    g_r, n_r = grads[side]
                    diff = max(float((a - b).abs().max()) for a, b in zip(g_r, g_b))
                    same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale) for a, b in zip(g_r, g_b))
                    checks[side] = {"max_abs_diff": diff, "max_abs_grad": scale, "allclose": same}
                    console.print(f"gradient check, {side} vs baseline, over {len(g_r)} LoRA tensors: max |grad| "
                                  f"{scale:.3e}, max |Δ grad| {diff:.3e} (relative {diff / scale:.1e}), grad norm "
                                  f"{n_r:.6e} vs {n_b:.6e}: {'allclose' if same else 'DIFFERENT'}")
                    if not same:
                        raise SystemExit(f"the {side} update and the baseline do not compute the same gradients")
            console.print(f"  update repeat {r + 1}: " + ", ".join(
                f"{side} {times[f'{side}_update'][-1]:.2f} s" for side in sides))
        start.restore(tr)

    t = {k: np.asarray(v) for k, v in times.items()}
    micro = -(-pairs // cfg.micro_batch)
    label = {"recast": "recast", "compiled": "recast, compile = true"}
    calls = {"sample": f"{-(-images // cfg.sample_batch)} chunk(s) of ≤{cfg.sample_batch} / "
                       f"{cfg.prompts_per_step} groups of {cfg.group_size}",
             "update": f"{micro} fwd/bwd of ≤{cfg.micro_batch} pairs / {len(tr.trained_steps)} fwd/bwd of {images}",
             "overall": ""}
    rows = []
    for side in sides[1:]:
        for stage in ("sample", "update", "overall"):
            if stage == "overall":
                mine, theirs = t[f"{side}_sample"] + t[f"{side}_update"], t["base_sample"] + t["base_update"]
                r_s = t[f"{side}_sample"].min() + t[f"{side}_update"].min()
                b_s = t["base_sample"].min() + t["base_update"].min()
            else:
                mine, theirs = t[f"{side}_{stage}"], t[f"base_{stage}"]
                r_s, b_s = mine.min(), theirs.min()
            paired = theirs / mine
            rows.append({"side": label[side], "stage": stage, "recast_s": float(r_s), "baseline_s": float(b_s),
                         "recast_img_s": images / r_s, "baseline_img_s": images / b_s, "ratio": float(b_s / r_s),
                         "paired_ratio_median": float(np.median(paired)),
                         "paired_ratios": [float(x) for x in paired], "calls": calls[stage]})

    table = Table(title=f"recast train vs a Flow-GRPO-style loop on the toy model: {cfg.prompts_per_step} prompts × "
                        f"G = {cfg.group_size}, {len(tr.trained_steps)} trained steps, best of {args.repeats}")
    for col in ("recast", "stage", "recast s", "baseline s", "recast img/s", "baseline img/s", "ratio (best)",
                "ratio (median of pairs)", "target", "calls (recast / baseline)"):
        table.add_column(col, justify="left" if col in ("recast", "stage") or col.startswith("calls") else "right")
    for row in rows:
        table.add_row(row["side"] if row["stage"] == "sample" else "", row["stage"], f"{row['recast_s']:.2f}",
                      f"{row['baseline_s']:.2f}", f"{row['recast_img_s']:.2f}", f"{row['baseline_img_s']:.2f}",
                      f"{row['ratio']:.2f}×", f"{row['paired_ratio_median']:.2f}×",
                      "≥ 1.3×" if row["stage"] == "overall" else "", row["calls"])
    console.print(table)
    enc, sc = min(base_parts["encode"]), min(base_parts["score"])
    console.print(f"baseline sampling parts (best): text encoding {enc:.2f} s, reward scoring {sc:.2f} s")

    result = {"images": images, "prompts": cfg.prompts_per_step, "group_size": cfg.group_size,
              "trained_steps": len(tr.trained_steps), "micro_batch": cfg.micro_batch, "sample_batch": cfg.sample_batch,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "times_s": times,
              "compile_warmup_s": compile_s, "rows": rows, "baseline_encode_s": enc, "baseline_score_s": sc,
              "grad_check": checks}
    if args.json == "-":
        json.dump(result, sys.stdout, indent=1)
        print()
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()

"""`recast estimate` on the toy model: wall time against its floor, and the share spent scoring.

The floor is what the model evaluations alone cost: every velocity call (transformer, both CFG
halves) and every VAE decode of rollout endpoints the estimate makes is recorded with its
batch size, and each is charged the best time of that call at that batch size measured on its
own in this process. The estimate runs ``--repeats`` times; after each run one pass of the
floor's calls follows, so a repeat's wall and floor see the same machine load. Two ratios are
printed: wall / transformer floor, and wall / full floor (transformer + VAE decodes; the rewards
need images, so decoding is model work too), each as best wall / best floor and as the median
of the per-repeat ratios (the less load-sensitive one). Near 1 means the rollout machinery
(noising, batching, noise draws, bookkeeping) adds little; the target is ≤ 1.15. The share of
wall time spent in the reward scorers (part of the wall, not of the floor) is printed beside them.
The model calls inside the timed runs are also timed where they happen: wall / in-run model time
(median over repeats) and the "machinery share" (wall not spent in model calls or scorers) say
the same thing without the floor passes' own timing noise.

Run: make bench  (uses pipelines/toy/model, or a random tiny model of the same architecture).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from recast_cli.estimate.rollouts import RolloutPlan, prompt_scores
from recast_cli.rewards import build_scorer
from recast_cli.toy.renderer import render_batch

ROOT = Path(__file__).resolve().parents[1]
REWARDS = ("toy_color", "toy_shape", "toy_sharpness")
PROMPT = "a red circle on a white background"


def main() -> None:
    import argparse

    from benchmarks.bench_rollouts import load_policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed estimates (and floor passes) to take the best of")
    repeats = max(1, ap.parse_args().repeats)

    torch.manual_seed(0)
    policy, label = load_policy(steps=10)
    scorers = [build_scorer(r) for r in REWARDS]
    calls: Counter[int] = Counter()
    decodes: Counter[int] = Counter()
    velocity, decode = policy.velocity, policy.decode

    def counted(x, sigma, cond):
        calls[len(x)] += 1
        return velocity(x, sigma, cond)

    def counted_decode(latents):
        decodes[len(latents)] += 1
        return decode(latents)

    score_time, model_time = [0.0], [0.0]

    def timed_velocity(x, sigma, cond):
        t1 = time.perf_counter()
        out = velocity(x, sigma, cond)
        model_time[0] += time.perf_counter() - t1
        return out

    def timed_decode(latents):
        t1 = time.perf_counter()
        out = decode(latents)
        model_time[0] += time.perf_counter() - t1
        return out

    class Timed:
        def __init__(self, scorer):
            self.scorer = scorer

        def score(self, images, prompts):
            t0 = time.perf_counter()
            out = self.scorer.score(images, prompts)
            score_time[0] += time.perf_counter() - t0
            return out

    N, K, batch = 4, 4, 40
    positives = [policy.encode(render_batch([PROMPT] * N, list(range(N)), 32))]
    plan = RolloutPlan(K=K, rollout_noise=1.414, batch_size=batch)
    policy.velocity, policy.decode = counted, counted_decode
    prompt_scores(policy, PROMPT, 0, [Timed(s) for s in scorers], plan, "pplus", positives=positives)
    policy.velocity, policy.decode = velocity, decode

    cond = policy.encode_prompts([PROMPT])
    inputs = {size: (torch.randn(size, *policy.latent_shape), torch.full((size,), 0.5),
                     cond.take(torch.zeros(size, dtype=torch.long))) for size in calls}
    latents = {size: torch.randn(size, *policy.latent_shape) for size in decodes}
    best_call = {size: float("inf") for size in calls}
    best_decode = {size: float("inf") for size in decodes}

    def floor_pass() -> tuple[float, float]:
        """Time every call size once (and every decode size once); charge each its recorded count."""
        transformer, vae = 0.0, 0.0
        with torch.no_grad():
            for size, count in calls.items():
                t1 = time.perf_counter()
                velocity(*inputs[size])
                dt = time.perf_counter() - t1
                best_call[size] = min(best_call[size], dt)
                transformer += count * dt
            for size, count in decodes.items():
                t1 = time.perf_counter()
                decode(latents[size])
                dt = time.perf_counter() - t1
                best_decode[size] = min(best_decode[size], dt)
                vae += count * dt
        return transformer, vae

    # The same estimate again, uninstrumented, `repeats` times; after each run, one pass of the
    # floor's calls, so the wall and the floor of a repeat see the same machine load. Reported:
    # best wall / best floor (each call size's best time), and the median of the per-repeat ratios.
    # The model calls of the timed runs are also timed where they happen ("in-run"): wall / in-run
    # model time is the machinery's overhead free of the floor passes' own timing noise.
    walls, ratios, in_run = [], [], []
    for _ in range(repeats):
        score_time[0] = model_time[0] = 0.0
        policy.velocity, policy.decode = timed_velocity, timed_decode
        t0 = time.perf_counter()
        prompt_scores(policy, PROMPT, 0, [Timed(s) for s in scorers], plan, "pplus", positives=positives)
        wall_r = time.perf_counter() - t0
        policy.velocity, policy.decode = velocity, decode
        walls.append((wall_r, score_time[0]))
        in_run.append((wall_r / model_time[0], 1 - (model_time[0] + score_time[0]) / wall_r))
        transformer_r, vae_r = floor_pass()
        ratios.append((wall_r / transformer_r, wall_r / (transformer_r + vae_r)))
    for _ in range(max(0, 15 - repeats)):  # more samples of the per-call best times
        floor_pass()
    wall, scoring = min(walls)
    score_time[0] = scoring
    floor = sum(count * best_call[size] for size, count in calls.items())
    decode_floor = sum(count * best_decode[size] for size, count in decodes.items())
    median_t = float(np.median([r[0] for r in ratios]))
    median_f = float(np.median([r[1] for r in ratios]))
    median_in = float(np.median([r[0] for r in in_run]))
    machinery = float(np.median([r[1] for r in in_run]))
    evaluations = sum(size * count for size, count in calls.items())
    table = Table(title=f"recast estimate on the {label}: N = {N}, K = {K}, T = {policy.T}, batch {batch}")
    for col in ("rollouts", "transformer calls", "sample-evaluations", "wall s", "transformer floor s",
                "wall / transformer floor", "+ VAE decode floor s", "wall / full floor", "median per-repeat",
                "wall / in-run model time", "target", "scoring share", "machinery share"):
        table.add_column(col, justify="right")
    full = floor + decode_floor
    table.add_row(str(N * K * policy.T), str(sum(calls.values())), str(evaluations), f"{wall:.2f}", f"{floor:.2f}",
                  f"{wall / floor:.3f}", f"{decode_floor:.2f}", f"{wall / full:.3f}",
                  f"{median_t:.3f} / {median_f:.3f}", f"{median_in:.3f}", "≤ 1.15",
                  f"{100 * score_time[0] / wall:.1f}%", f"{100 * machinery:.1f}%")
    Console(width=250).print(table)


if __name__ == "__main__":
    main()

"""`recast estimate` on the toy model: wall time against its floor, and the share spent scoring.

The floor is what the model evaluations alone cost: every velocity call (transformer, both CFG
halves) and every VAE decode of rollout endpoints the estimate makes is recorded with its
batch size, and each is charged the best time (of 15) of that call at that batch size measured on
its own in this process. Two ratios are printed: wall / transformer floor, and wall / full
floor (transformer + VAE decodes; the rewards need images, so decoding is model work too).
Near 1 means the rollout machinery (noising, batching, noise draws, bookkeeping) adds
little; the target is ≤ 1.15. The share of wall time spent in the reward scorers is printed
beside them.

Run: make bench  (uses pipelines/toy/model, or a random tiny model of the same architecture).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

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
    from benchmarks.bench_rollouts import load_policy

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

    score_time = [0.0]

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
    # the same estimate again, uninstrumented; the best of three walls, against the best time of each call (min over 15 runs): both sides best-case
    walls = []
    for _ in range(3):
        score_time[0] = 0.0
        t0 = time.perf_counter()
        prompt_scores(policy, PROMPT, 0, [Timed(s) for s in scorers], plan, "pplus", positives=positives)
        walls.append((time.perf_counter() - t0, score_time[0]))
    wall, scoring = min(walls)
    score_time[0] = scoring

    cond = policy.encode_prompts([PROMPT])
    floor = 0.0
    with torch.no_grad():
        for size, count in calls.items():
            x = torch.randn(size, *policy.latent_shape)
            c = cond.take(torch.zeros(size, dtype=torch.long))
            sigma = torch.full((size,), 0.5)
            times = []
            for _ in range(15):
                t1 = time.perf_counter()
                velocity(x, sigma, c)
                times.append(time.perf_counter() - t1)
            floor += count * min(times)
        decode_floor = 0.0
        for size, count in decodes.items():
            z = torch.randn(size, *policy.latent_shape)
            times = []
            for _ in range(15):
                t1 = time.perf_counter()
                decode(z)
                times.append(time.perf_counter() - t1)
            decode_floor += count * min(times)
    evaluations = sum(size * count for size, count in calls.items())
    table = Table(title=f"recast estimate on the {label}: N = {N}, K = {K}, T = {policy.T}, batch {batch}")
    for col in ("rollouts", "transformer calls", "sample-evaluations", "wall s", "transformer floor s",
                "wall / transformer floor", "+ VAE decode floor s", "wall / full floor", "target", "scoring share"):
        table.add_column(col, justify="right")
    full = floor + decode_floor
    table.add_row(str(N * K * policy.T), str(sum(calls.values())), str(evaluations), f"{wall:.2f}", f"{floor:.2f}",
                  f"{wall / floor:.3f}", f"{decode_floor:.2f}", f"{wall / full:.3f}", "≤ 1.15",
                  f"{100 * score_time[0] / wall:.1f}%")
    Console(width=190).print(table)


if __name__ == "__main__":
    main()

"""Mixed-t batched rollouts vs per-t sequential rollouts on the toy model, and model throughput.

The estimator runs K rollouts from every step t = 1..T. Mixed-t batching runs all of them
together: T iterations, one model call each over every sample that still has steps left.
The per-t baseline runs one batch per start step t (t iterations each, Σ_t t calls in all).
Both do the same work with the same noise and give the same endpoints; the table prints the
wall-time ratio measured in this process, and model evaluations per second at batch 1, 8, 32.

Run: make bench  (uses pipelines/toy/model; falls back to a random tiny model of the same
architecture when the trained one is absent — the cost is the same).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from recast_cli.policy.sd3 import SD3Policy
from recast_cli.toy.model import build_pipeline, save_pipeline
from recast_cli.toy.pretrain import MAX_SEQUENCE_LENGTH, toy_words

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a white background"


def load_policy(steps: int) -> tuple[SD3Policy, str]:
    folder = ROOT / "pipelines" / "toy" / "model"
    label = "trained toy model"
    if not (folder / "model_index.json").is_file():
        folder = Path(tempfile.mkdtemp()) / "model"
        save_pipeline(build_pipeline(toy_words()), folder)
        label = "random tiny model (same architecture)"
    return SD3Policy.from_pretrained(folder, steps=steps, guidance_scale=4.5, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                     device="cpu"), label


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    torch.manual_seed(0)
    steps, k = 10, 4
    policy, label = load_policy(steps)
    t = torch.arange(1, steps + 1).repeat_interleave(k)
    n = len(t)
    cond = policy.encode_prompts([PROMPT] * n)
    x = torch.randn(n, *policy.latent_shape)
    seeds = torch.arange(n)

    def mixed():
        return policy.rollout(x, t, cond, 1.414, seeds)

    def per_t():
        out = torch.empty_like(x)
        for step in range(1, steps + 1):
            idx = torch.nonzero(t == step).view(-1)
            out[idx] = policy.rollout(x[idx], t[idx], cond.take(idx), 1.414, seeds[idx])
        return out

    mixed_s, a = timed(mixed)
    per_t_s, b = timed(per_t)
    table = Table(title=f"Rollouts on the {label}: T = {steps}, K = {k} per start step ({n} rollouts)")
    for col in ("method", "model calls", "seconds", "speed-up", "max |Δ endpoint|"):
        table.add_column(col, justify="right")
    table.add_row("per-t sequential (baseline)", str(steps * (steps + 1) // 2), f"{per_t_s:.3f}", "1.00x", "")
    table.add_row("mixed-t batched", str(steps), f"{mixed_s:.3f}", f"{per_t_s / mixed_s:.2f}x",
                  f"{float((a - b).abs().max()):.1e}")
    console = Console(width=120)
    console.print(table)

    rates = Table(title="Model evaluations per second (one velocity call = CFG pair, CPU)")
    for col in ("batch", "calls/s", "samples/s", "vs batch 1"):
        rates.add_column(col, justify="right")
    base = None
    for batch in (1, 8, 32):
        xb = torch.randn(batch, *policy.latent_shape)
        cb = policy.encode_prompts([PROMPT] * batch)
        sigma = torch.full((batch,), 0.5)
        with torch.no_grad():
            seconds, _ = timed(lambda: [policy.velocity(xb, sigma, cb) for _ in range(10)])
        per_s = batch * 10 / seconds
        base = base or per_s
        rates.add_row(str(batch), f"{10 / seconds:.1f}", f"{per_s:.1f}", f"{per_s / base:.2f}x")
    console.print(rates)


if __name__ == "__main__":
    main()

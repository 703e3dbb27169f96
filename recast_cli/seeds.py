"""Every seed rule of recast in one place: which seed each image, rollout and noise draw gets.

All rules are pure functions of integers (numpy only, no torch), so a result depends on the
run seed and the item's identity — never on batch sizes, process counts or resumption:

* positives and evaluation images: image ``s`` of prompt ``p`` uses ``seed + STRIDE·p + s``
  (:func:`image_seed`), stable when N grows;
* estimation rollouts: a polynomial hash of (seed, prompt, positive set, n, k, t)
  (:func:`rollout_seeds`), with the slots below for the shared ε^n and trajectory seeds;
* training samples: SplitMix64 of (seed, step, global image index) (:func:`train_seeds`);
* per-step noise of a sampler: SplitMix64 counters of (sample seed, step, element), turned into
  normals by Box-Muller (:func:`hashed_normal`; :func:`recast_cli.policy.base.step_noise`), or a
  torch generator seeded by :func:`step_noise_seed` for large latents;
* the analytic worlds' exact π⁺ draws (:func:`analytic_positive_seed`), a trained flow1d policy's
  SIR draws (:func:`sir_draw_seeds`, :func:`sir_rng`) and the toy renderer's positives
  (:func:`renderer_seeds`);
* the trainer's prompt epochs (:func:`epoch_rng`) and its order of (image, step) pairs
  (:func:`update_rng`); SIR positives of ``sample-positive --source self`` (:func:`self_sir_rng`).

The toy model's pretraining draws its batches from ``default_rng([seed, stage, index])``
(``recast_cli/toy/pretrain.py``), a rule of that one-off job, not of a study.
"""

from __future__ import annotations

import numpy as np

#: image s of prompt p is seeded ``seed + IMAGE_STRIDE·p + s`` (positives and evaluations)
IMAGE_STRIDE = 100_000
#: the multiplier of :func:`rollout_seeds`' polynomial hash, and its 62-bit mask
ROLLOUT_STRIDE = np.uint64(1_000_003)
ROLLOUT_MASK = np.uint64(2**62 - 1)
NO_STEP = -1  # the t slot of a seed shared by every start step (common random numbers)
TRAJECTORY_SET = 1 << 20  # the positive-set slot of π^old-sampling's seeds
EPS_ROLLOUT = -1  # the k slot of the ε^n seed
TRAJECTORY_ROLLOUT = -2  # the k slot of the trajectory seed
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser: a bijective mix of 64-bit counters into uniform bits."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def image_seed(seed: int, prompt_id: int, sample_id: int) -> int:
    """Seed of image ``sample_id`` of prompt ``prompt_id``: distinct per prompt while N ≤ IMAGE_STRIDE."""
    return seed + IMAGE_STRIDE * prompt_id + sample_id


def rollout_seeds(seed: int, prompt_id: int, reward_set: int, n: np.ndarray, k: np.ndarray | int,
                  t: np.ndarray | int) -> np.ndarray:
    """Distinct reproducible seeds per (run seed, prompt, positive set, sample n, rollout k, start step t).

    A polynomial hash in uint64 arithmetic (wrapping), vectorised over n, k, t.
    """
    value = np.zeros(np.broadcast(n, k, t).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for part in (seed, prompt_id, reward_set, n, k, t):
            value = value * ROLLOUT_STRIDE + (np.asarray(part).astype(np.int64) + 7).astype(np.uint64)
    return (value & ROLLOUT_MASK).astype(np.int64)


def train_seeds(seed: int, step: int, index: np.ndarray) -> np.ndarray:
    """Noise seed of global image ``index`` at training step ``step`` (62-bit, collision-free in practice)."""
    with np.errstate(over="ignore"):
        mixed = splitmix64(np.uint64(seed) * GOLDEN + np.uint64(step + 1))
        values = splitmix64(mixed + index.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03))
    return (values >> np.uint64(2)).astype(np.int64)


def hashed_normal(seeds: np.ndarray, steps: np.ndarray, size: int) -> np.ndarray:
    """Standard normals [B, size] from (seed, step, element) counters: Box-Muller on two hashes."""
    with np.errstate(over="ignore"):
        base = splitmix64(seeds.astype(np.uint64) * GOLDEN + steps.astype(np.uint64))
        counters = base[:, None] + np.arange(size, dtype=np.uint64)[None, :] * np.uint64(2) * GOLDEN
        u1 = ((splitmix64(counters) >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
        u2 = ((splitmix64(counters + GOLDEN) >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def step_noise_seed(seed: int, step: int) -> int:
    """The torch generator seed of (sample seed, step) for latents too large for :func:`hashed_normal`."""
    return (int(seed) * 1_000_003 + int(step) * 7_919) % (2**63 - 1)


def analytic_positive_seed(seed: int, prompt: int, reward_index: int) -> int:
    """Seed of the exact π⁺ draws of reward ``reward_index`` for replicate ``prompt`` (gmm1d, flow1d)."""
    return seed * 1_000_003 + prompt * 101 + reward_index


def sir_draw_seeds(seed: int, prompt: int, draws: int) -> np.ndarray:
    """Sample seeds of the π^old draws a trained flow1d policy's π⁺ is resampled from."""
    return np.arange(draws, dtype=np.int64) + 7_919 * (analytic_positive_seed(seed, prompt, 0) + 1)


def sir_rng(seed: int, prompt: int, reward_index: int) -> np.random.Generator:
    """The generator that resamples reward ``reward_index``'s positives from those draws."""
    return np.random.default_rng([analytic_positive_seed(seed, prompt, 0), reward_index])


def renderer_seeds(seed: int, prompt_id: int, n: int) -> list[int]:
    """Seeds of the toy renderer's ``n`` positives of a prompt (``recast estimate`` without --positives)."""
    return [seed * 1_000_003 + prompt_id * 1000 + k for k in range(n)]


def self_sir_rng(draw_seed: int, prompt_id: int, reward_index: int) -> np.random.Generator:
    """The generator of ``sample-positive --source self``'s resampling (draw 0's seed, prompt, reward)."""
    return np.random.default_rng([draw_seed, prompt_id, reward_index])


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of the trainer's prompt order in ``epoch`` (one permutation per epoch)."""
    return np.random.default_rng([seed, epoch, 0x7EC457])


def update_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of the order of (image, trained step) pairs in the update of training step ``step``."""
    return np.random.default_rng([seed, step, 0xADADAD])


"""Every count recast accepts, with its allowed range: one table, one check, one line when out of range.

A count that sizes work or memory — steps, images, rollouts, bootstrap resamples, batch sizes,
seeds — is checked against :data:`BOUNDS` before anything is read, allocated or written: on the
command line (each command checks its flags first), in a setting file (each table's parser) and
in ``--set KEY=VALUE``. Out of range is BadInput, one line naming the option, the value and the
range (``--steps must be an integer from 1 to 1000, got 1000000``).

Two products size one allocation each and have a ceiling of their own (:data:`PRODUCTS`): the
scores array of ``recast estimate`` and the images of one training step.

The ranges are wide enough for every setting shipped here many times over, and small enough
that no single count can ask for gigabytes. Seeds are 32-bit: every seed rule of
``recast_cli/seeds.py`` (``seed + 100000·prompt + k``, the 62-bit rollout hash, SplitMix64 in
uint64, numpy and torch generators) stays exact far inside int64 for them. Images per prompt
stop at ``seeds.IMAGE_STRIDE``, the stride that keeps image seeds of different prompts apart.
docs/settings.md lists the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recast_cli.errors import BadInput, shown
from recast_cli.seeds import IMAGE_STRIDE


@dataclass(frozen=True)
class Bound:
    """The closed range ``low … high`` of one kind of count, and where recast accepts it."""

    low: int
    high: int
    where: str


BOUNDS: dict[str, Bound] = {
    "seed": Bound(0, 2**32 - 1, "every --seed; [train] seed, [evaluate] seed, [study] seeds"),
    "steps": Bound(1, 10_000, "sampling and grid steps T: [policy] steps, [evaluate] steps, [study] estimate_steps; "
                            "--steps of estimate, sample, sample-positive, solve-w"),
    "images_per_prompt": Bound(1, IMAGE_STRIDE, "sample, sample-positive and evaluate --n; [evaluate] n; [study] eval_n"),
    "draws": Bound(1, IMAGE_STRIDE, "sample-positive --draws (π^old draws per prompt S)"),
    "positives_per_prompt": Bound(1, 10_000, "estimate --n (N); [study] n"),
    "rollouts": Bound(1, 10_000, "estimate --k (K); [study] k"),
    "prompts": Bound(1, 100_000, "estimate --p (P); [study] p"),
    "bootstrap": Bound(0, 10_000, "estimate and merge --bootstrap"),
    "batch": Bound(1, 2**16, "--batch-size (estimate, evaluate, score, serve-reward), --max-batch (serve-reward), "
                            "--batch (sample, sample-positive, toy pretrain); [train] micro_batch, sample_batch; "
                            "[evaluate] batch_size; a scorer's batch_size option"),
    "resolution": Bound(8, 8192, "[policy] resolution; sample-positive --resolution"),
    "max_sequence_length": Bound(1, 8192, "[policy] max_sequence_length"),
    "features": Bound(1, 32, "[policy] features (flow1d)"),
    "hidden": Bound(1, 4096, "[policy] hidden (flow1d)"),
    "training_steps": Bound(1, 1_000_000, "train --max-steps, [train] max_steps, stall_window, stall_smoothing; toy pretrain --steps, --vae-steps"),
    "warmup_steps": Bound(0, 1_000_000, "[train] warmup_steps, [study] warmup_steps"),
    "checkpoint": Bound(0, 1_000_000, "evaluate --checkpoint"),
    "save_every": Bound(1, 1_000_000, "train --save-every, [train] save_every"),
    "keep_checkpoints": Bound(1, 1000, "[train] keep_checkpoints"),
    "group_size": Bound(2, 1024, "train --group-size, [train] group_size, [study] group_sizes (G: advantages need two images)"),
    "prompts_per_step": Bound(1, 4096, "train --prompts-per-step, [train] prompts_per_step"),
    "updates_per_step": Bound(1, 1000, "[train] updates_per_step"),
    "lora_rank": Bound(0, 4096, "[train] lora_rank (0: full fine-tuning)"),
    "log_images_every": Bound(0, 1_000_000, "[train] log_images_every (0: no sample grids)"),
    "skip_clean": Bound(0, 9999, "solve-w --skip-clean"),
    "grid_prompts": Bound(0, 100, "report --prompts (prompts per sample grid)"),
    "quality_images": Bound(1, 1000, "toy quality --n (images per prompt, all held at once)"),
    "concurrency": Bound(1, 256, "sample-positive --concurrency; a chat scorer's concurrency option (unifiedreward)"),
    "retries": Bound(0, 100, "sample-positive --retries (after the first try)"),
    "tries": Bound(1, 100, "judge --retries; a server scorer's retries option (NAME@URL, geneval, unifiedreward): "
                           "tries per request"),
    "max_pixels": Bound(1, 2**28, "serve-reward --max-pixels (pixels per image)"),
    "connections": Bound(1, 4096, "serve-reward --max-connections (one thread each)"),
    "study_seeds": Bound(1, 65_536, "study --seeds, [study] seeds (a list or \"LO:HI\"; seeds per cell, trained as one "
                                    "batch)"),
}


@dataclass(frozen=True)
class Product:
    """A ceiling on the product of counts that sizes one allocation."""

    limit: int
    what: str


PRODUCTS: dict[str, Product] = {
    "score_cells": Product(2**28, "estimate: scores P·N·(T+1)·K·m, float64 (2 GiB)"),
    "bootstrap_cells": Product(2**26, "estimate, merge: bootstrap resamples × (T+1) × m, float64, two arrays "
                                      "(1 GiB)"),
    "images_per_step": Product(2**16, "train: images per step, group_size × prompts_per_step"),
    "study_cell": Product(2**27, "study: one cell's seeds × rollouts per step (group_size × prompts_per_step) × T, "
                                 "each of its trajectory arrays, float64 (1 GiB)"),
    "study_cell_bytes": Product(2**34, "study: one cell's working set, estimated from the arrays the batched engine "
                                       "allocates (16 GiB)"),
}


def check(kind: str, value: Any, option: str) -> Any:
    """``value`` if it is an integer in ``BOUNDS[kind]`` (None passes: an option left out);
    BadInput naming ``option``, the value and the range else. A boolean is no integer."""
    if value is None:
        return value
    bound = BOUNDS[kind]
    if isinstance(value, bool) or not isinstance(value, int) or not bound.low <= value <= bound.high:
        raise BadInput(f"{option} must be an integer from {bound.low} to {bound.high}, got {shown(value)}")
    return value


def check_all(*items: tuple[str, str, Any]) -> None:
    """:func:`check` for each ``(kind, option, value)``, in order: a command's flags, before its work."""
    for kind, option, value in items:
        check(kind, value, option)


def check_bytes(kind: str, estimate: int, counts: Mapping[str, int]) -> None:
    """BadInput unless ``estimate``, the bytes that ``counts`` (name → count) need, is within ``PRODUCTS[kind]``."""
    limit = PRODUCTS[kind].limit
    if estimate > limit:
        terms = ", ".join(f"{name} {value}" for name, value in counts.items())
        raise BadInput(f"{terms}: {PRODUCTS[kind].what.split(' (')[0]}, is {estimate / 2**30:.1f} GiB, more than "
                       f"{limit / 2**30:g} GiB; lower one of them")


def seed_range(lo: int, hi: int, option: str) -> range:
    """The seeds of the half-open range ``lo:hi``, checked as numbers before the range is built: the
    count against ``study_seeds``, then its first and last seed against ``seed`` (BadInput naming
    ``option``). An empty range (``hi <= lo``) is returned as it is, for the caller's own line."""
    if hi > lo:
        check("study_seeds", hi - lo, f"{option} (how many)")
        check("seed", lo, option)
        check("seed", hi - 1, option)
    return range(lo, hi)


def check_product(kind: str, factors: Mapping[str, int]) -> None:
    """BadInput unless the product of ``factors`` (name → count) is within ``PRODUCTS[kind]``."""
    product = PRODUCTS[kind]
    total = math.prod(factors.values())
    if total > product.limit:
        terms = " × ".join(f"{name} {value}" for name, value in factors.items())
        raise BadInput(f"{terms} = {total} is more than {product.limit} ({product.what}); lower one of them")

"""The seed rules (recast_cli/seeds.py): stable values, distinct seeds, no torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from recast_cli.seeds import (
    EPS_ROLLOUT,
    IMAGE_STRIDE,
    NO_STEP,
    hashed_normal,
    image_seed,
    rollout_seeds,
    train_seeds,
)


def test_image_seeds_follow_the_documented_rule():
    assert image_seed(7, 0, 0) == 7 and image_seed(7, 3, 5) == 7 + 3 * IMAGE_STRIDE + 5
    seeds = {image_seed(0, p, s) for p in range(20) for s in range(50)}
    assert len(seeds) == 1000


def test_train_seeds_depend_on_seed_step_and_index_only():
    index = np.arange(64)
    a = train_seeds(3, 5, index)
    assert a.dtype == np.int64 and np.all(a >= 0) and len(set(a.tolist())) == 64
    assert np.array_equal(a[10:20], train_seeds(3, 5, index[10:20]))  # a slice: how work is split does not matter
    assert not np.array_equal(a, train_seeds(3, 6, index)) and not np.array_equal(a, train_seeds(4, 5, index))


def test_pinned_values():
    """Changing any rule changes every committed study's images: these values were printed on
    2026-12-04 by the rules as they were then moved here from trainer, rollouts and policy/base."""
    assert train_seeds(0, 0, np.array([0, 1])).tolist() == [2210426850126958239, 3017932863940013178]
    assert rollout_seeds(1, 2, 0, np.array([0]), 0, 0).tolist() == [4240778123871741961]
    assert hashed_normal(np.array([1]), np.array([2]), 2).tolist() == [[-0.3603418801075146, 1.216514667614825]]


def test_rollout_seeds_are_distinct_over_their_slots():
    n, k, t = np.meshgrid(np.arange(4), np.arange(-2, 6), np.arange(-1, 10), indexing="ij")
    seeds = rollout_seeds(1, 2, 0, n, k, t)
    assert len(set(seeds.ravel().tolist())) == seeds.size and np.all(seeds >= 0)
    assert rollout_seeds(1, 2, 0, np.array([0]), EPS_ROLLOUT, NO_STEP)[0] == seeds[0, 1, 0]


def test_hashed_normals_are_standard_and_reproducible():
    z = hashed_normal(np.arange(200), np.full(200, 3), 50)
    assert z.shape == (200, 50) and abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03
    assert np.array_equal(z[5:7], hashed_normal(np.arange(5, 7), np.full(2, 3), 50))


def test_the_seed_rules_import_no_torch():
    code = "import sys, recast_cli.seeds; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_other_rules_keep_their_values():
    """The rules moved here from estimate/stage, policy/base, positives/sir, prompts and the trainer
    (values printed on 2026-12-04 and checked equal to the old inline formulas)."""
    from recast_cli.seeds import (
        analytic_positive_seed,
        epoch_rng,
        renderer_seeds,
        self_sir_rng,
        sir_draw_seeds,
        sir_rng,
        step_noise_seed,
        update_rng,
    )

    assert step_noise_seed(3, 7) == 3055442 and analytic_positive_seed(2, 3, 1) == 2000310
    assert sir_draw_seeds(2, 3, 3).tolist() == [15840454890, 15840454891, 15840454892]
    assert sir_rng(2, 3, 1).integers(1000, size=3).tolist() == [402, 284, 248]
    assert renderer_seeds(2, 5, 2) == [2005006, 2005007]
    assert self_sir_rng(10, 2, 1).integers(1000, size=3).tolist() == [760, 733, 201]
    assert epoch_rng(1, 2).permutation(6).tolist() == [3, 1, 4, 0, 2, 5]
    assert update_rng(1, 2).permutation(6).tolist() == [5, 3, 2, 1, 4, 0]
